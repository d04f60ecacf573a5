"""Demo stages 1, 3 and 4: embedded shards, curation by krablet workers, shard export."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlparse

from krea2.infra import UserError
from krea2.infra.progress import Progress, progress
from krea2.pipeline.cli_runner import krea2, parallel


def start_shards(out: Path, shards: int) -> Path:
    """Start (or restart) the embedded shards; returns the cluster file."""
    data = out / "warehouse"
    krea2("krablet", "up", "--shards", str(shards), "--data", str(data))
    return data / "cluster.json"


def stop_shards(out: Path) -> None:
    krea2("krablet", "down", "--data", str(out / "warehouse"))


# The curate DAG as the demo runs it: (stage, extra options, worker processes or None for
# the demo's count). Global passes (dedup, concepts) and the captioner run once.
CURATE_RUNS: tuple[tuple[str, tuple[str, ...], int | None], ...] = (
    ("analyze", (), None),
    ("dedup", (), 1),
    ("ocr", (), None),
    ("tags", ("--tagger", "shapes"), None),
    ("concepts", (), 1),
    ("captions", ("--captioner", "shapes"), 1),
)


def curate_pool(pool_dir: Path, cluster: Path, workers: int, log: Path) -> dict:
    """Ingest the pool and run the curate DAG with ``workers`` processes per job.

    Each stage shows its progress read from the warehouse, and must have done every one
    of its rows before the next starts: a worker that stopped early (a signal, a crash)
    exits non-zero, but the warehouse is the record, so it is checked too.
    """
    from krea2.curate import open_warehouse, stage_progress

    c = ["--cluster", str(cluster)]
    krea2("curate", "ingest", str(pool_dir), "--name", "pool", *c, log=log)
    wh = open_warehouse(str(cluster))
    try:
        for stage, extra, processes in CURATE_RUNS:
            command = ["curate", "run", "--stages", stage, *extra, *c]
            done, total = stage_progress(wh, [stage])[stage]
            with progress(f"curate {stage}", total, unit="row", completed=done) as bar:

                def poll(stage: str = stage, bar: Progress = bar) -> None:
                    bar.update(*stage_progress(wh, [stage])[stage][:1])

                parallel([command] * (processes or workers), log, poll=poll)
                done, total = stage_progress(wh, [stage])[stage]
                bar.update(done, total=total)
            if done < total:
                raise UserError(
                    f"curate stage {stage!r} ended with {done} of {total} rows done; "
                    "run the demo again with the same --out to finish it"
                )
    finally:
        wh.close()
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
    """Counts kept/rejected per reason; precision/recall per injected defect class over the
    injected pool and the one-object scenes' first renders (the population the curation
    metrics have always been measured on); and, apart, what curation did with the
    one-object re-renders and later takes, against the generator's labels."""
    from krea2.curate import clean_kept, final_reason, precision_recall
    from krea2.pipeline.pool import is_one_object, read_labels

    labels = read_labels(labels_path)
    rows = [r for r in warehouse_rows(cluster) if file_of(r["uri"]) in labels]
    reasons = [final_reason(r) for r in rows]
    # The concept cap keeps a fair share of an over-represented concept on purpose, so its
    # detection is scored on the flag "carries a concept above the cap", not on the drops.
    detected = [
        reason or ("overrepresented" if r.get("concept_over") else None)
        for r, reason in zip(rows, reasons, strict=True)
    ]
    entries = [labels[file_of(r["uri"])] for r in rows]
    truth = [m["label"] for m in entries]
    outcomes = [reason or "kept" for reason in reasons]
    # One-object re-renders and later takes are scored apart: with them the table would
    # mostly measure hash dedup on sub-pixel re-renders of flat shapes (one_object_truth).
    apart = [is_one_object(m) and m["label"] != "clean" for m in entries]
    scored = [i for i, a in enumerate(apart) if not a]
    one_object: dict[str, Counter] = {}
    for o, t, a in zip(outcomes, truth, apart, strict=True):
        if a:
            one_object.setdefault(t, Counter())[o] += 1
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
        "one_object_truth": {t: dict(c.most_common()) for t, c in sorted(one_object.items())},
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
