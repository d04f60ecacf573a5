"""Demo stages 1, 3 and 4: embedded shards, curation by krablet workers, shard export."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import unquote, urlparse

from krea2.infra import UserError
from krea2.infra.progress import Progress, progress
from krea2.pipeline.cli_runner import krea2, parallel
from krea2.pipeline.config import CurateSpec


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
# Embedding-level curation, after the toy encoder is trained on the pool's hash keepers:
# vectors, semantic dedup in k-means leaves, the SAE artifact filter, balanced sampling.
# One process runs them all (the job's one worker, then the passes): each process start
# imports torch and FAISS, which costs more than the toy pool's work.
EMBED_RUNS: tuple[tuple[str, tuple[str, ...], int | None], ...] = (
    ("embed,semantic,sae,balance", (), 1),
)
PASSES_IN_FUNNEL = ("semantic", "sae", "balance")  # their counts go into the funnel


def curate_pool(
    pool_dir: Path, cluster: Path, workers: int, log: Path, spec: CurateSpec | None = None
) -> dict:
    """Ingest the pool and run the curate DAG with ``workers`` processes per job, then
    (``spec``) train the toy encoder on the hash keepers and run the embedding stages.

    Each stage shows its progress read from the warehouse, and must have done every one
    of its rows before the next starts: a worker that stopped early (a signal, a crash)
    exits non-zero, but the warehouse is the record, so it is checked too.
    """
    from krea2.curate import open_warehouse

    spec = spec or CurateSpec()
    c = ["--cluster", str(cluster)]
    krea2("curate", "ingest", str(pool_dir), "--name", "pool", *c, log=log)
    ladder = ("--set", f"dedup.ladder_max_distance={spec.ladder_max_distance}")
    curate_runs = [(st, (*extra, *ladder) if st == "dedup" else extra, n)
                   for st, extra, n in CURATE_RUNS]  # fmt: skip
    encoder = pool_dir.parent / "encoder"
    sets = [
        *("--set", f"embed.store={pool_dir.parent / 'embeddings'}"),
        *("--set", f"balance.share={spec.balance_share}"),
        *("--set", f"sae.steps={spec.sae_steps}"),
        *("--set", f"semantic.verify={spec.verify}"),
    ]
    embedder = ("--embedder", f"toy:{encoder}")
    embed_runs = [(stage, (*extra, *embedder, *sets), n) for stage, extra, n in EMBED_RUNS]
    passes: dict[str, dict] = {}
    wh = open_warehouse(str(cluster))
    try:
        _run_stages(wh, curate_runs, c, workers, log, passes)
        start = time.perf_counter()
        if not (encoder / "config.json").is_file():  # saved last: present = a whole model
            with progress("curate train-encoder", 1, unit="model") as bar:
                steps = ("--steps", str(spec.encoder_steps), "--no-flips")
                krea2("curate", "train-encoder", "--out", str(encoder), *steps, *c, log=log)
                bar.update(1)
        _run_stages(wh, embed_runs, c, workers, log, passes)
        passes["seconds"] = round(time.perf_counter() - start, 1)  # encoder and embed stages
    finally:
        wh.close()
    return funnel(cluster, pool_dir / "labels.jsonl") | {"passes": passes}


def _run_stages(
    wh: object,
    runs: Sequence[tuple[str, tuple[str, ...], int | None]],
    cluster_args: list[str],
    workers: int,
    log: Path,
    passes: dict[str, dict],
) -> None:
    """Run each ``(stages, extra options, processes)`` as ``krea2 curate run`` workers with
    the first stage's progress (``stages``: one name, or several run in order by each
    worker); the counts of a pass of ``PASSES_IN_FUNNEL``, read back from the warehouse
    (``krea2.curate.pass_log``), go into ``passes``."""
    from krea2.curate import pass_results, stage_progress

    for stages, extra, processes in runs:
        names = stages.split(",")
        command = ["curate", "run", "--stages", stages, *extra, *cluster_args]
        done, total = stage_progress(wh, names[:1])[names[0]]
        with progress(f"curate {names[0]}", total, unit="row", completed=done) as bar:

            def poll(stage: str = names[0], bar: Progress = bar) -> None:
                bar.update(*stage_progress(wh, [stage])[stage][:1])

            started = time.time()
            parallel([command] * (processes or workers), log, poll=poll)
            done, total = stage_progress(wh, names[:1])[names[0]]
            bar.update(done, total=total)
        for stage, (done, total) in stage_progress(wh, names).items():
            if done < total:
                raise UserError(
                    f"curate stage {stage!r} ended with {done} of {total} rows done; "
                    "run the demo again with the same --out to finish it"
                )
        wanted = [n for n in names if n in PASSES_IN_FUNNEL]
        recorded = pass_results(wh, wanted)
        for stage in wanted:
            if stage not in recorded or recorded[stage]["finished"] < started:
                raise UserError(
                    f"`krea2 {' '.join(command)}` recorded no new {stage!r} result in "
                    f"the warehouse; see {log}"
                )
            passes[stage] = recorded[stage]["result"]


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
            "sem_kind",
            "sem_dup_of",
            "sae_reject",
            "cluster_reject",
            "sample_keep",
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
    from krea2.curate.shapes import SEMANTIC_DUPLICATE
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
        "embedding": embedding_metrics(rows, entries, apart),
        "counts": dict(counts.most_common()),
        # Copies that hashes miss have their own table (``embedding``): hash dedup catches
        # some of them (tone and blur edits) under its own reason, which this one would
        # count as semantic dedup's misses.
        "precision_recall": {
            cls: m
            for cls, m in precision_recall(
                [truth[i] for i in scored], [detected[i] for i in scored]
            ).items()
            if cls != SEMANTIC_DUPLICATE
        },
        "clean_kept": clean_kept(truth, reasons),
        "one_object_truth": {t: dict(c.most_common()) for t, c in sorted(one_object.items())},
        "examples": examples,
        "duplicate_groups": dup_groups,
    }


def embedding_metrics(rows: list[dict], entries: list[dict], apart: list[bool]) -> dict:
    """Embedding-level curation against the generator's labels (``rows[i]`` is the
    warehouse row of pool entry ``entries[i]``; ``apart``: one-object renders beyond each
    concept's first, scored apart as in ``funnel``).

    ``semantic_dedup``: over the rows the semantic pass compared (hash keepers), recall is
    the share of injected copies it dropped, precision the share of its drops (outside
    ``apart``) that are copies matched to their own source; ``apart_dropped`` counts what
    it did with the one-object re-renders and later takes. ``sae_filter``: its flags
    against the injected artifacts that reach it (text_dense). ``balance``: kept rows
    before and after balanced sampling, and the share of the over-represented concept."""
    from krea2.curate.shapes import SEMANTIC_DUPLICATE

    key_of = {r["image_key"]: m["key"] for r, m in zip(rows, entries, strict=True)}
    compared = [i for i, r in enumerate(rows) if r.get("sem_kind") is not None]
    if not compared:
        return {}
    copies = [i for i in compared if entries[i]["label"] == SEMANTIC_DUPLICATE]
    dropped = [i for i in compared if rows[i]["sem_kind"]]
    scored = [i for i in dropped if not apart[i]]
    right = [
        i
        for i in scored
        if entries[i]["label"] == SEMANTIC_DUPLICATE
        and key_of.get(rows[i]["sem_dup_of"]) == entries[i].get("source")
    ]
    wrong = [
        [entries[i]["file"], key_of.get(rows[i]["sem_dup_of"]), entries[i]["label"]]
        for i in scored
        if i not in set(right)
    ]
    semantic = {
        "compared": len(compared),
        "copies": len(copies),
        "copies_dropped": sum(bool(rows[i]["sem_kind"]) for i in copies),
        "dropped": len(dropped),
        "precision": len(right) / len(scored) if scored else 1.0,
        "recall": sum(bool(rows[i]["sem_kind"]) for i in copies) / len(copies) if copies else 1.0,
        "wrong": wrong[:10],
        "missed": [entries[i]["file"] for i in copies if not rows[i]["sem_kind"]][:10],
        "apart_dropped": dict(Counter(entries[i]["label"] for i in dropped if apart[i])),
    }
    artifacts = [i for i in compared if entries[i]["label"] == "text_dense"]
    flagged = [i for i in compared if rows[i].get("sae_reject")]
    sae = {
        "artifacts": len(artifacts),
        "flagged": len(flagged),
        "precision": (
            sum(entries[i]["label"] == "text_dense" for i in flagged) / len(flagged)
            if flagged
            else 1.0
        ),
        "recall": (
            sum(bool(rows[i].get("sae_reject")) for i in artifacts) / len(artifacts)
            if artifacts
            else 1.0
        ),
    }
    sampled = [i for i in compared if rows[i].get("sample_keep") is not None]
    before = [i for i in sampled if final_before_balance(rows[i]) is None]
    after = [i for i in before if rows[i]["sample_keep"]]

    def over(ix: list[int]) -> float:
        return sum(entries[i]["label"] == "overrepresented" for i in ix) / max(1, len(ix))

    balance = {
        "kept_before": len(before),
        "kept_after": len(after),
        "overrepresented_share_before": round(over(before), 4),
        "overrepresented_share_after": round(over(after), 4),
    }
    return {"semantic_dedup": semantic, "sae_filter": sae, "balance": balance}


def embedding_section(curate: dict) -> str:
    """The report's HTML for ``curate["embedding"]`` (``embedding_metrics``) and the
    passes' own counts."""
    from krea2.pipeline import html

    m, passes = curate.get("embedding") or {}, curate.get("passes") or {}
    if not m:
        return '<p class="note">no embedding-level curation in this run</p>'
    sd, sae, bal = m["semantic_dedup"], m["sae_filter"], m["balance"]
    sem = passes.get("semantic", {})
    rows = [
        ["semantic dedup (copies hashes missed)", sd["copies"], sd["dropped"],
         f"{sd['precision']:.3f}", f"{sd['recall']:.3f}"],
        ["SAE artifact filter (text_dense)", sae["artifacts"], sae["flagged"],
         f"{sae['precision']:.3f}", f"{sae['recall']:.3f}"],
    ]  # fmt: skip
    table = html.table(["filter", "injected", "flagged", "precision", "recall"], rows)
    apart = ", ".join(f"{k} {v}" for k, v in sd["apart_dropped"].items()) or "none"
    s = passes.get("sae", {})
    notes = [
        f"Toy encoder trained on the pool's hash keepers; {sem.get('candidates', '?')} "
        f"candidate pairs within its leaves (cosine ≥ {sem.get('threshold', '?')} − slack), "
        f"{sem.get('verified', '?')} confirmed as crops or tone edits on the pixels. "
        f"Semantic dedup compared {sd['compared']} rows; precision counts its drops outside "
        f"the one-object re-renders and later takes, which it dropped apart: {apart}.",
        f"SAE: FVU {s.get('fvu', float('nan')):.3f}, L0 {s.get('l0', float('nan')):.1f}, "
        f"dead features {s.get('dead_features', '?')}; artifact features "
        f"{s.get('artifact_features') or 'none'} (labelled by the enrichment of the rows "
        "they dominate in reject reasons).",
        f"Balanced sampling over the k-means hierarchy kept {bal['kept_after']} of "
        f"{bal['kept_before']} rows; over-represented concept share "
        f"{bal['overrepresented_share_before']:.3f} → {bal['overrepresented_share_after']:.3f}.",
    ]
    return table + "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)


def final_before_balance(row: dict) -> str | None:
    """A row's reject reason from every stage before balanced sampling."""
    from krea2.curate import final_reason

    return final_reason({**row, "sample_keep": None})


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
