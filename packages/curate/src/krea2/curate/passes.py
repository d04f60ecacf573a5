"""The DAG's global passes: dedup and the concept cap, each recomputed over the warehouse.

Both are idempotent (they rewrite their result columns from scratch for the rows their
stage's ``when`` selects), so a rerun after a crash or after more ingest is always safe.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from krea2.curate.config import CurateConfig
from krea2.curate.stages import STAGES_BY_NAME, TABLE
from krea2.curate.warehouse import scan_all
from krea2.krablet import Warehouse


def dedup_pass(wh: Warehouse, cfg: CurateConfig) -> dict[str, int]:
    """Recompute duplicate groups over every analyzed row that passed the cheap filters and
    write ``dup_keep``/``dup_kind``/``dup_of``. Rows are ordered by ingest ``seq``. Rows
    analysed before crop ladders existed (``ladder`` NULL) are deduplicated by their phash
    alone and counted in ``rows_without_crop_ladder``."""
    from krea2.curate.crop_ladder import LADDER_BYTES
    from krea2.curate.dedup import dedup_configured

    cols = ["image_key", "seq", "uri", "md5", "width", "height", "phash8", "phash12",
            "colorhash", "huehist", "ladder"]  # fmt: skip
    rows = list(scan_all(wh, STAGES_BY_NAME["dedup"].filters(), cols))
    if not rows:
        return {"rows": 0, "duplicates": 0}
    rows.sort(key=lambda r: (r["seq"] if r["seq"] is not None else 0, r["image_key"]))

    def stack(col: str, n: int) -> np.ndarray:
        # A NULL (a ladder of a row analysed before ladders existed) reads as zeros: no match.
        return np.stack([np.frombuffer(bytes(r[col] or bytes(n)), np.uint8)[:n] for r in rows])

    areas = np.asarray([(r["width"] or 0) * (r["height"] or 0) for r in rows], np.int64)
    result = dedup_configured(
        [r["md5"] for r in rows],
        stack("phash12", 18),
        stack("colorhash", 6),
        stack("phash8", 8),
        areas,
        stack("huehist", 19),
        cfg.dedup,
        stack("ladder", LADDER_BYTES),
        _pixels(rows),  # read only for the crop-ladder pairs to verify
    )
    keeper = {int(result.group[i]): rows[i]["image_key"] for i in np.nonzero(result.keep)[0]}
    patch = [
        {
            "image_key": r["image_key"],
            "dup_keep": bool(result.keep[i]),
            "dup_kind": str(result.kind[i]),
            "dup_of": keeper[int(result.group[i])],
        }
        for i, r in enumerate(rows)
    ]
    with wh.funnel() as f:
        f.patch(TABLE, patch)
        f.flush()
    out = {"rows": len(rows), "duplicates": int((~result.keep).sum())}
    if result.ladder_checked:  # crop-ladder pairs the pixel check refused: look-alikes
        out["ladder_verified"] = result.ladder_kept
        out["ladder_refused"] = result.ladder_checked - result.ladder_kept
    if missing := sum(r["ladder"] is None for r in rows):
        # Analysed before crop ladders: found as before (phash), not as crops or overlays.
        out["rows_without_crop_ladder"] = missing
    return out


def concept_pass(wh: Warehouse, cfg: CurateConfig) -> dict[str, int]:
    """Recompute the over-represented-concept cap over every tagged row."""
    from krea2.curate.concepts import rebalance

    rows = list(scan_all(wh, STAGES_BY_NAME["concepts"].filters(), ["image_key", "tags"]))
    if not rows:
        return {"rows": 0, "dropped": 0}
    c = cfg.concepts
    verdicts = rebalance(
        [r["image_key"] for r in rows], [frozenset(r["tags"]) for r in rows], c.max_share, c.seed
    )
    with wh.funnel() as f:
        f.patch(
            TABLE,
            [
                {
                    "image_key": r["image_key"],
                    "concept_share": v.share,
                    "concept_keep": v.keep,
                    "concept_over": v.overrepresented,
                }
                for r, v in zip(rows, verdicts, strict=True)
            ],
        )
        f.flush()
    return {"rows": len(rows), "dropped": sum(not v.keep for v in verdicts)}


def embedder_threshold(models: set[str], configured: float) -> float:
    """The semantic threshold: ``configured`` when set (> 0), else the one the embedder of
    every row records (the toy encoder's calibrated threshold, in its ``config.json``)."""
    import json

    from krea2.curate.embed.loaders import parse_spec
    from krea2.infra.errors import UserError

    if len(models) > 1:
        raise UserError(
            f"rows were embedded by several models {sorted(models)}; vectors of "
            "different models cannot be compared: re-embed with one"
        )
    if configured > 0:
        return configured
    kind, path = parse_spec(next(iter(models)))
    if kind == "toy" and (path / "config.json").is_file():
        return float(json.loads((path / "config.json").read_text())["threshold"])
    raise UserError(
        f"{kind} embeddings carry no copy threshold: set semantic.threshold "
        "(e.g. --set semantic.threshold=0.9; SSCD's authors use 0.75)"
    )


def semantic_pass(wh: Warehouse, cfg: CurateConfig) -> dict[str, int]:
    """Recompute semantic dedup over every embedded row: hierarchical k-means, then the
    keep rule inside bounded leaves (``krea2.curate.semantic_dedup``); rank = part 1's
    keep rule (largest, then earliest ingest)."""
    cols = ["image_key", "seq", "uri", "width", "height", "embedding", "embed_model"]
    rows = list(scan_all(wh, STAGES_BY_NAME["semantic"].filters(), cols))
    if not rows:
        return {"rows": 0, "duplicates": 0}
    # One order whatever the shards return: k-means' sample and seeds follow row order.
    rows.sort(key=lambda r: (r["seq"] if r["seq"] is not None else 0, r["image_key"]))
    c = cfg.semantic
    threshold = embedder_threshold({r["embed_model"] for r in rows}, c.threshold)
    keys = [r["image_key"] for r in rows]
    with tempfile.TemporaryDirectory(prefix="krea2-semantic-", dir=c.spill_dir or None) as tmp:
        x = _gather(rows, keys, c.max_memory_mb, Path(tmp))
        return _semantic(wh, rows, keys, x, threshold, c)


def _gather(rows: list[dict], keys: list[str], max_memory_mb: float, tmp: Path) -> np.ndarray:
    """The rows' vectors, in memory or, past ``max_memory_mb``, in a memmap under ``tmp``."""
    from krea2.curate.embed.store import read_vectors, split_ref

    refs = [r["embedding"] for r in rows]
    dim = np.load(split_ref(refs[0])[0], mmap_mode="r").shape[1]
    if len(refs) * dim * 2 <= max_memory_mb * 2**20:
        return read_vectors(refs, keys)
    out = np.lib.format.open_memmap(tmp / "vectors.npy", "w+", np.float16, (len(refs), dim))
    return read_vectors(refs, keys, out=out)


def _semantic(
    wh: Warehouse, rows: list[dict], keys: list[str], x: np.ndarray, threshold: float, c
) -> dict[str, int]:
    from krea2.curate.kmeans import hierarchical_kmeans
    from krea2.curate.review import record_clusters
    from krea2.curate.semantic_dedup import keep_rule, similar_pairs

    n = len(rows)
    k = [max(1, -(-n // (c.leaf_size * 8**level))) for level in range(c.levels)]
    h = hierarchical_kmeans(x, k, seed=c.seed)
    order = sorted(
        range(n),
        key=lambda i: (
            -(rows[i]["width"] or 0) * (rows[i]["height"] or 0),
            rows[i]["seq"] or 0,
            keys[i],
        ),
    )
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    search = threshold - c.verify_slack if c.verify > 0 else threshold
    pairs, sims, leaves = similar_pairs(x, h.leaf, search, c.max_leaf, c.probe, c.margin)
    candidates = len(pairs)
    if c.verify > 0 and len(pairs):
        pairs, sims = _verified(rows, pairs, sims, c)
    keep, dup_of, similarity = keep_rule(n, rank, pairs, sims)
    paths = h.paths()[:, ::-1]  # top level first
    patch = [
        {
            "image_key": keys[i],
            "sem_keep": bool(keep[i]),
            "sem_kind": "" if keep[i] else "semantic_duplicate",
            "sem_dup_of": keys[i] if keep[i] else keys[int(dup_of[i])],
            "sem_similarity": float(similarity[i]),
            "cluster": "/".join(str(int(v)) for v in paths[i]),
        }
        for i in range(n)
    ]
    with wh.funnel() as f:
        f.patch(TABLE, patch)
        f.flush()
    flagged = record_clusters(wh, [p["cluster"] for p in patch])
    return {
        "rows": n,
        "duplicates": int((~keep).sum()),
        "leaves": int(leaves.max()) + 1,
        "flagged": flagged,
        "threshold": round(threshold, 4),
        "candidates": candidates,
        "verified": len(pairs),
    }


def _pixels(rows: list[dict]):
    """A ``copy_verify.PixelReader`` of the rows' images (their ``uri``, decoded again)."""
    from krea2.curate.copy_verify import decoding_reader
    from krea2.curate.storage import read_uri

    sizes = [(r["width"], r["height"]) if r["width"] and r["height"] else None for r in rows]
    return decoding_reader(lambda i: read_uri(rows[i]["uri"]), sizes)


def _verified(rows: list[dict], pairs: np.ndarray, sims: np.ndarray, c) -> tuple:
    """The candidate ``pairs`` (at most ``c.candidates`` per row) that pass the pixel check,
    with the check's scores as their similarity. A row whose image no longer reads is left
    out of every pair (kept: nothing to compare it with)."""
    from krea2.curate.copy_verify import View, top_candidates, verify_read

    pairs = pairs[top_candidates(pairs, sims, c.candidates)]
    ok, scores = verify_read(pairs, _pixels(rows), c.verify, View(side=c.verify_side))
    return pairs[ok], scores[ok]


def caption_check_pass(wh: Warehouse, cfg: CurateConfig) -> dict:
    """Write ``caption_reject``/``caption_omits`` for every captioned row (a VLM that
    consistently omits a salient attribute: ``krea2.curate.captioning``)."""
    from krea2.curate.captioning import OMISSION, omissions

    cols = ["image_key", "captions", "tags", "ocr_text"]
    rows = list(scan_all(wh, STAGES_BY_NAME["caption_check"].filters(), cols))
    c = cfg.captions
    rates, per_row = omissions(rows, c.min_omission_rate, c.min_rows)
    patch = [
        {
            "image_key": r["image_key"],
            "caption_reject": OMISSION if left else "",
            "caption_omits": ",".join(left),
        }
        for r, left in zip(rows, per_row, strict=True)
    ]
    with wh.funnel() as f:
        f.patch(TABLE, patch)
        f.flush()
    return {
        "rows": len(rows),
        "rejected": sum(bool(p["caption_reject"]) for p in patch),
        "omitted": {v: round(x, 3) for v, x in sorted(rates.items())},
    }
