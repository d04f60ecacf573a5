"""Demo stages 1, 3 and 4: embedded shards, curation by krablet workers, shard export."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlparse

from krea2.pipeline.cli_runner import krea2, parallel


def start_shards(out: Path, shards: int) -> Path:
    """Start (or restart) the embedded shards; returns the cluster file."""
    data = out / "warehouse"
    krea2("krablet", "up", "--shards", str(shards), "--data", str(data))
    return data / "cluster.json"


def stop_shards(out: Path) -> None:
    krea2("krablet", "down", "--data", str(out / "warehouse"))


def curate_pool(pool_dir: Path, cluster: Path, workers: int, log: Path) -> dict:
    """Ingest the pool and run the curate DAG with ``workers`` processes per job."""
    c = ["--cluster", str(cluster)]
    krea2("curate", "ingest", str(pool_dir), "--name", "pool", *c, log=log)
    for stage, extra in (("analyze", []), ("ocr", []), ("tags", ["--tagger", "shapes"])):
        parallel([["curate", "run", "--stages", stage, *extra, *c]] * workers, log)
        if stage == "analyze":
            krea2("curate", "run", "--stages", "dedup", *c, log=log)
    krea2("curate", "run", "--stages", "concepts", *c, log=log)
    krea2("curate", "run", "--stages", "captions", "--captioner", "shapes", *c, log=log)
    return funnel(cluster, pool_dir / "labels.jsonl")


def warehouse_rows(cluster: Path) -> list[dict]:
    from krea2.curate import open_warehouse, read_rows

    wh = open_warehouse(str(cluster))
    try:
        cols = [
            "image_key",
            "uri",
            "reject",
            "dup_kind",
            "dup_of",
            "text_reject",
            "concept_keep",
            "concept_over",
            "md5",
            "width",
            "height",
        ]
        return read_rows(wh, cols)
    finally:
        wh.close()


def file_of(uri: str) -> str:
    return Path(unquote(urlparse(uri).path)).name


def funnel(cluster: Path, labels_path: Path) -> dict:
    """Counts kept/rejected per reason and precision/recall per injected defect class (over
    the images with ground truth: all but the one-object variants, counted apart)."""
    from krea2.curate import clean_kept, final_reason, precision_recall
    from krea2.pipeline.pool import VARIANT, read_labels

    labels = read_labels(labels_path)
    rows = [r for r in warehouse_rows(cluster) if file_of(r["uri"]) in labels]
    reasons = [final_reason(r) for r in rows]
    # The concept cap keeps a fair share of an over-represented concept on purpose, so its
    # detection is scored on the flag "carries a concept above the cap", not on the drops.
    detected = [
        reason or ("overrepresented" if r.get("concept_over") else None)
        for r, reason in zip(rows, reasons, strict=True)
    ]
    truth = [labels[file_of(r["uri"])]["label"] for r in rows]
    outcomes = [reason or "kept" for reason in reasons]
    scored = [i for i, t in enumerate(truth) if t != VARIANT]
    variants = Counter(o for o, t in zip(outcomes, truth, strict=True) if t == VARIANT)
    counts = Counter(outcomes)
    examples: dict[str, list[str]] = {}
    for r, reason in zip(rows, reasons, strict=True):
        if reason and len(examples.setdefault(reason, [])) < 6:
            examples[reason].append(file_of(r["uri"]))
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r.get("dup_of") and r.get("dup_kind"):
            groups.setdefault(r["dup_of"], []).append(file_of(r["uri"]))
    by_key = {r["image_key"]: file_of(r["uri"]) for r in rows}
    dup_groups = [[by_key[k], *v] for k, v in list(groups.items())[:6] if k in by_key]
    return {
        "images": len(rows),
        "counts": dict(counts.most_common()),
        "precision_recall": precision_recall(
            [truth[i] for i in scored], [detected[i] for i in scored]
        ),
        "clean_kept": clean_kept(truth, reasons),
        "variants": dict(variants),
        "examples": examples,
        "duplicate_groups": dup_groups,
    }


def export_stage(cluster: Path, out: Path, side: int, batch: int, log: Path) -> dict:
    """Export the kept rows at ``side`` px with the captions the warehouse holds."""
    krea2(
        "curate",
        "export",
        "--out",
        str(out),
        "--side",
        str(side),
        "--batch-size",
        str(batch),
        "--stage",
        str(side),
        "--cluster",
        str(cluster),
        log=log,
    )
    files = sorted(out.glob("shard-*.parquet"))
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return {"dir": str(out), "files": len(files), "rows": rows}
