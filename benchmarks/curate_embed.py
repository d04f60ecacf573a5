"""Semantic dedup over 1M synthetic vectors: ours (bounded leaves, FAISS range search per
bucket, neighbouring-leaf probes; also with probes off, ``ours-1probe``) against exact
all-pairs within the same leaves (SemDeDup's way: the full similarity matrix of each leaf),
time and peak memory; and each one's recall against exact global search.

Vectors: ``--n`` unit float16 vectors of dimension ``--dim`` around ``--concepts`` random
centres (a clustered pool), of which ``--copies`` are noisy copies of others (cosine ≈
0.97 with their source), written once to an ``.npy`` memmap. Each method runs in its own
child process (peak RSS from ``getrusage``, so FAISS's and numpy's memory both count) on
the same leaves: one hierarchical k-means (``--leaf-size``) fitted beforehand and saved.
Recall: for ``--queries`` random rows, every partner with cosine ≥ threshold anywhere in
the pool (FAISS exact range search against all n) — the share of those pairs that ours
finds, and that the leaf baseline finds (which cannot see across leaves).

Run from the root: ``uv run python -m benchmarks.curate_embed [--n 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

import numpy as np

from benchmarks.report import write_results

METHODS = ("ours", "ours-1probe", "exact")


def make_vectors(path: Path, n: int, dim: int, concepts: int, copies: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(concepts, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    out = np.lib.format.open_memmap(path, "w+", np.float16, (n, dim))
    base = n - copies
    chunk = 100_000
    for s in range(0, base, chunk):
        m = min(chunk, base - s)
        x = centres[rng.integers(0, concepts, m)] + 0.12 * rng.normal(size=(m, dim))
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    src = rng.choice(base, copies, replace=False)
    for s in range(0, copies, chunk):
        part = src[s : s + chunk]
        x = out[part].astype(np.float32) + 0.025 * rng.normal(size=(len(part), dim))
        out[base + s : base + s + len(part)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.flush()


def exact_leaf_pairs(x: np.ndarray, leaf: np.ndarray, threshold: float) -> np.ndarray:
    """The baseline: per leaf, the full (m, m) similarity matrix and its upper triangle."""
    order = np.argsort(leaf, kind="stable")
    bounds = np.flatnonzero(np.r_[True, leaf[order][1:] != leaf[order][:-1], True])
    found = []
    for s, e in pairwise(bounds):
        members = np.sort(order[s:e])
        xs = x[members].astype(np.float32)
        sim = xs @ xs.T
        i, j = np.nonzero(np.triu(sim >= threshold, 1))
        found.append(np.stack([members[i], members[j]], axis=1))
    return np.concatenate(found) if found else np.zeros((0, 2), np.int64)


def child(method: str, work: Path, threshold: float, max_leaf: int) -> None:
    """One method in this process: writes its pairs and its time."""
    from krea2.curate.semantic_dedup import similar_pairs

    x = np.load(work / "x.npy", mmap_mode="r")
    leaf = np.load(work / "leaf.npy")
    start = time.perf_counter()
    if method == "ours":
        pairs, _, _ = similar_pairs(x, leaf, threshold, max_leaf)
    elif method == "ours-1probe":  # the baseline's blocking, FAISS range search per leaf
        pairs, _, _ = similar_pairs(x, leaf, threshold, max_leaf, probe=1)
    else:  # SemDeDup: the k-means leaves as they come (no bound), full matrices
        pairs = exact_leaf_pairs(x, leaf, threshold)
    seconds = time.perf_counter() - start
    np.save(work / f"pairs-{method}.npy", pairs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB
    (work / f"{method}.json").write_text(json.dumps({"seconds": seconds, "peak_rss_mib": peak}))


def run_child(method: str, work: Path, threshold: float, max_leaf: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.curate_embed",
        "--child",
        method,
        "--work",
        str(work),
        "--threshold",
        str(threshold),
        "--max-leaf",
        str(max_leaf),
    ]
    subprocess.run(cmd, check=True)
    return json.loads((work / f"{method}.json").read_text())


def exact_partners(x: np.ndarray, queries: np.ndarray, threshold: float) -> set[tuple[int, int]]:
    import faiss

    index = faiss.IndexFlatIP(x.shape[1])
    for s in range(0, len(x), 200_000):
        index.add(np.ascontiguousarray(x[s : s + 200_000], np.float32))
    q = np.ascontiguousarray(x[queries], np.float32)
    lims, _, ids = index.range_search(q, float(np.nextafter(np.float32(threshold), -1)))
    out = set()
    for k, qi in enumerate(queries.tolist()):
        for j in ids[lims[k] : lims[k + 1]].tolist():
            if j != qi:
                out.add((min(qi, j), max(qi, j)))
    return out


def markdown(results: dict) -> str:
    """The docs/benchmarks.md section of a run."""
    from benchmarks.report import table

    s = results["settings"]
    rows = [
        [
            m,
            f"{results[m]['seconds']:.1f}",
            f"{results[m]['peak_rss_mib']:.0f}",
            results[m]["pairs"],
            f"{results[m]['recall_vs_global_exact']:.4f}",
        ]
        for m in METHODS
    ]
    return (
        f"## Curate: semantic dedup over 1M vectors, leaves of ~{s['leaf_size']} "
        "(`benchmarks/curate_embed.py`)\n\n"
        f"{s['n']} unit float16 vectors (d={s['dim']}) around {s['concepts']} centres, "
        f"{s['copies']} of them noisy copies; threshold {s['threshold']}; the same "
        f"hierarchical k-means leaves (mean {s['leaf_size']}, largest {results['leaf_max']}; "
        f"k-means {results['kmeans_s']:.0f} s, not in the times) for every method, each in "
        "its own process (peak RSS, which includes the memory-mapped vectors' pages). "
        "`exact`: every leaf's full similarity matrix (SemDeDup; leaves as k-means made "
        f"them); `ours-1probe`: leaves split to at most {s['max_leaf']} rows, FAISS range "
        "search per leaf; `ours`: plus two neighbouring leaves within 0.1 of the row's own "
        "(the default). Recall against exact global range search "
        f"for {s['queries']} random rows ({results['global_truth_pairs']} pairs); ours finds "
        f"{results['ours_recall_vs_exact_leaves']:.4f} of the exact-in-leaves pairs.\n\n"
        + table(["method", "seconds", "peak RSS MiB", "pairs", "recall vs global exact"], rows)
    )


def throughput(n_images: int, batch: int, repeats: int) -> dict:
    """Images/s of one DINOv3-ViT (random, ViT-Tiny size, 224 px) on ShapesWorld JPEGs:
    a plain transformers loop (decode, preprocess, forward, one after the other) against
    ``TorchEmbedder.embed_batches`` fed lazily (decode and preprocess of batch k+1 in the
    prep thread while batch k runs), once with the loop's PIL decode and once with the
    embed job's own decode (``krea2.curate.decode`` at 256 px, reduced-scale JPEG)."""
    import io

    import torch
    from PIL import Image
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    from krea2.curate.decode import decode
    from krea2.curate.embed import load_embedder, resize_batch
    from krea2.curate.embed.loaders import IMAGENET_MEAN, IMAGENET_STD
    from krea2.curate.shapes import make_pool

    pool = make_pool(seed=0, n_clean=n_images, n_per_defect=0, n_overrepresented=0, classes=())
    datas = [it.data for it in pool]
    torch.manual_seed(0)
    cfg = DINOv3ViTConfig(
        hidden_size=192,
        num_hidden_layers=12,
        num_attention_heads=3,
        intermediate_size=768,
        patch_size=16,
        image_size=224,
    )
    with tempfile.TemporaryDirectory() as tmp:
        DINOv3ViTModel(cfg).save_pretrained(tmp)
        emb = load_embedder(f"dinov3:{tmp}", batch_size=batch)
        model = DINOv3ViTModel.from_pretrained(tmp).eval()

    def pil(d: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(d)).convert("RGB"))

    def plain() -> np.ndarray:
        out = []
        for s in range(0, len(datas), batch):
            px = resize_batch(
                [pil(d) for d in datas[s : s + batch]], (224, 224), IMAGENET_MEAN, IMAGENET_STD
            )
            with torch.inference_mode():
                f = model(pixel_values=px).pooler_output
            out.append(torch.nn.functional.normalize(f, dim=1).numpy())
        return np.concatenate(out)

    def ours(read) -> np.ndarray:
        batches = ([read(d) for d in datas[s : s + batch]] for s in range(0, len(datas), batch))
        return np.concatenate(list(emb.embed_batches(batches))).astype(np.float32)

    runs = {
        "plain transformers loop": plain,
        "ours, PIL decode": lambda: ours(pil),
        "ours, job decode": lambda: ours(lambda d: decode(d).pixels),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    outputs = {}
    for _ in range(repeats):  # alternate, so load on the shared machine hits each alike
        for name, fn in runs.items():
            t = time.perf_counter()
            outputs[name] = fn()
            times[name].append(time.perf_counter() - t)
    rate = {k: len(datas) / float(np.median(v)) for k, v in times.items()}
    same = float((outputs["ours, PIL decode"] * outputs["plain transformers loop"]).sum(1).min())
    return {
        "images": len(datas),
        "batch": batch,
        "repeats": repeats,
        "images_per_s": rate,
        "ratio_pil": rate["ours, PIL decode"] / rate["plain transformers loop"],
        "ratio_job": rate["ours, job decode"] / rate["plain transformers loop"],
        "min_cosine_same_decode": same,
        "threads": torch.get_num_threads(),
        "seconds": times,
    }


def throughput_markdown(r: dict) -> str:
    from benchmarks.report import table

    base = r["images_per_s"]["plain transformers loop"]
    rows = [[k, f"{v:.1f}", f"{v / base:.2f}×"] for k, v in r["images_per_s"].items()]
    return (
        "## Curate: embedding throughput (`benchmarks/curate_embed.py --throughput`)\n\n"
        f"{r['images']} ShapesWorld JPEGs (320-600 px), a random DINOv3 ViT of ViT-Tiny size "
        f"(12 × 192, patch 16, 224 px) on the CPU ({r['threads']} torch threads), batches of "
        f"{r['batch']}, median of {r['repeats']} alternating runs. Same model, same inputs "
        "with the PIL decode (min cosine between the two outputs "
        f"{r['min_cosine_same_decode']:.4f}).\n\n"
        + table(["path", "images/s", "vs plain"], rows)
        + "\n\nNot yet understood: the gap is larger than overlapping the decode can "
        "explain (decoding and resizing 32 images take well under a second here), and the "
        "two models' forward passes timed alone on one batch differ by less than the "
        "machine's noise. Read it as: the batched job is at least as fast as the plain "
        "loop (the target is ≥ 1.0×), not as a measured 2.4× speed-up."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--concepts", type=int, default=2000)
    ap.add_argument("--copies", type=int, default=50_000)
    ap.add_argument("--leaf-size", type=int, default=1000)
    ap.add_argument("--max-leaf", type=int, default=4096)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--queries", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", choices=METHODS)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--report-only", type=Path, help="Re-render the docs section from a JSON.")
    ap.add_argument("--area", default="curate_embed", help="Results file and docs section.")
    ap.add_argument("--throughput", action="store_true", help="Measure images/s instead.")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.throughput:
        results = throughput(args.images, args.batch, args.repeats)
        print(json.dumps(results, indent=1))
        write_results("curate_embed_throughput", results, throughput_markdown(results))
        return
    if args.report_only:
        results = json.loads(args.report_only.read_text())
        write_results(args.area, results, markdown(results))
        return
    if args.child:
        child(args.child, args.work, args.threshold, args.max_leaf)
        return

    from krea2.curate.kmeans import hierarchical_kmeans

    with tempfile.TemporaryDirectory(prefix="curate-embed-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        make_vectors(work / "x.npy", args.n, args.dim, args.concepts, args.copies, args.seed)
        x = np.load(work / "x.npy", mmap_mode="r")
        print(f"{args.n} vectors in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        k = [max(1, args.n // args.leaf_size), max(1, args.n // (args.leaf_size * 8))]
        h = hierarchical_kmeans(x, k, seed=args.seed)
        kmeans_s = time.perf_counter() - t
        np.save(work / "leaf.npy", h.leaf)
        sizes = np.bincount(h.leaf)
        print(
            f"k-means {k} in {kmeans_s:.1f} s; leaf sizes median {np.median(sizes):.0f}, "
            f"max {sizes.max()}",
            flush=True,
        )
        results: dict = {
            "settings": {k: str(v) for k, v in vars(args).items()},
            "kmeans_s": kmeans_s,
            "leaf_max": int(sizes.max()),
        }
        for method in METHODS:
            results[method] = run_child(method, work, args.threshold, args.max_leaf)
            results[method]["pairs"] = len(np.load(work / f"pairs-{method}.npy"))
            print(f"{method}: {results[method]}", flush=True)
        queries = np.random.default_rng(args.seed + 1).choice(args.n, args.queries, replace=False)
        t = time.perf_counter()
        truth = exact_partners(x, queries, args.threshold)
        qset = set(queries.tolist())
        for method in METHODS:
            pairs = np.load(work / f"pairs-{method}.npy")
            mine = {(int(a), int(b)) for a, b in pairs if int(a) in qset or int(b) in qset}
            results[method]["recall_vs_global_exact"] = len(mine & truth) / max(1, len(truth))
        ours = {tuple(p) for p in np.load(work / "pairs-ours.npy").tolist()}
        exact = {tuple(p) for p in np.load(work / "pairs-exact.npy").tolist()}
        results["ours_recall_vs_exact_leaves"] = len(ours & exact) / max(1, len(exact))
        results["global_truth_pairs"] = len(truth)
        print(
            f"recall vs global exact ({len(truth)} pairs of {args.queries} queries, "
            f"{time.perf_counter() - t:.0f} s): ours "
            f"{results['ours']['recall_vs_global_exact']:.4f}, leaves without probes "
            f"{results['exact']['recall_vs_global_exact']:.4f}; ours vs exact-in-leaves "
            f"{results['ours_recall_vs_exact_leaves']:.4f}",
            flush=True,
        )
    write_results(args.area, results, markdown(results))
    print(f"wrote benchmarks/results/{args.area}.json and its docs/benchmarks.md section")


if __name__ == "__main__":
    main()
