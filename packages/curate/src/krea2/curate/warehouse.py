"""The curate warehouse from Python: open it, ingest, run stages, read rows back.

>>> wh = open_warehouse("/tmp/kb/cluster.json")
>>> ingest(wh, Path("/tmp/pool"), "pool")
>>> run_stages(wh, ["analyze", "dedup", "ocr", "tags", "concepts", "captions"],
...            tagger="shapes", captioner="shapes")
>>> kept = kept_rows(wh, ["uri", "captions"])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krea2.curate.config import CurateConfig
from krea2.curate.handlers import configured
from krea2.curate.pass_log import pass_results_table, record_pass_result
from krea2.curate.plugins import check_embedder, check_heads, check_plugin, load_object
from krea2.curate.sources import Skipped
from krea2.curate.stages import (
    COLUMNS,
    KEY,
    STAGE_NAMES,
    STAGES,
    STAGES_BY_NAME,
    TABLE,
    Stage,
    StageKind,
    clusters_table,
    final_reason,
    images_table,
    reject_columns,
    stages_named,
)
from krea2.krablet import Funnel, Warehouse, Worker

# Columns a plain read leaves out: raw hash bytes, only the dedup pass reads them.
HASH_COLUMNS = ("phash8", "phash12", "colorhash", "huehist", "ladder")

JobRunner = Callable[[Warehouse, Stage, type], Any]


def open_warehouse(cluster: str | None) -> Warehouse:
    """Open (and migrate) the warehouse holding the ``images`` table (with ``clusters``, the
    k-means review queue, ``krea2.curate.review``, and ``pass_results``, each pass's last
    counts, ``krea2.curate.pass_log``); ``cluster`` is a
    cluster file or comma-separated DSNs (default: ``$KRABLET_CLUSTER``)."""
    from krea2.krablet import default_cluster_source

    tables = [images_table(), clusters_table(), pass_results_table()]
    return Warehouse.open(default_cluster_source(cluster), tables=tables)


@dataclass
class IngestResult:
    """What an ingest did: rows listed, rows already present whose ``meta`` (sidecars)
    changed, the stages queued again for them (``stages_reading("meta")``), and the files a
    directory listing skipped."""

    rows: int = 0
    meta_changed: int = 0
    requeued: list[str] = field(default_factory=list)
    skipped: Skipped = field(default_factory=Skipped)

    def lines(self, source: object, verbose: bool = False) -> list[str]:
        """What to tell the user, the first line always, each other one when it applies
        (``verbose``: every skipped file too)."""
        out = [f"ingested {self.rows} images from {source} (`krea2 curate run` processes them)"]
        if self.meta_changed:
            stages, names = ", ".join(self.requeued), ",".join(self.requeued)
            out.append(
                f"{self.meta_changed} already ingested images have changed sidecars: their "
                f"{stages} are queued again (`krea2 curate run --stages {names} ...`)"
            )
        if self.skipped.files and not verbose:
            out.append(self.skipped.summary() + " (--verbose names them)")
        elif self.skipped.files:
            out.append(self.skipped.summary() + ":")
            out += [f"  skipped {rel}: {why}" for rel, why in self.skipped.files]
        return out


def ingest_rows(wh: Warehouse, rows: Iterable[dict], batch: int = 5000) -> IngestResult:
    """Upsert listed rows (key, uri, source, meta) with an ingest sequence number;
    idempotent for keys already present: their stage results are untouched, except that a
    row whose ``meta`` changed (a sidecar added, edited or removed) is queued again for the
    stages that read it (``requeue``)."""
    base = time.time_ns() // 1000
    result = IngestResult()
    reader = wh.reader()
    changed: list[str] = []

    def write(f: Funnel, chunk: list[dict]) -> None:
        with_meta = [r for r in chunk if "meta" in r]
        if with_meta:  # read before writing: what changed is what the rows held before
            before = reader.get(TABLE, [r[KEY] for r in with_meta], ["meta"])
            changed.extend(
                k for r in with_meta if (k := r[KEY]) in before and before[k]["meta"] != r["meta"]
            )
        f.upsert(TABLE, chunk)

    with wh.funnel() as f:
        chunk: list[dict] = []
        for row in rows:
            chunk.append(row | {"seq": base + result.rows})
            result.rows += 1
            if len(chunk) >= batch:
                write(f, chunk)
                chunk = []
        if chunk:
            write(f, chunk)
        f.flush()
    result.meta_changed = len(changed)
    if changed:
        for stage in stages_reading("meta"):
            requeue(wh, stage, changed)
            result.requeued.append(stage.name)
    return result


def stages_reading(column: str) -> list[Stage]:
    """The job stages handed ``column`` (``inputs``): a change to it makes their results stale."""
    return [s for s in STAGES if s.kind is StageKind.JOB and column in s.inputs]


def dependent_stages(stage: Stage) -> list[Stage]:
    """``stage`` and the stages whose ``when`` reads its results, transitively (DAG order):
    what clearing ``stage``'s results leaves stale."""
    out, cleared = [stage], set(stage.columns)
    for s in STAGES:
        if s not in out and any(c in cleared for c, _, _ in s.when):
            out.append(s)
            cleared |= set(s.columns)
    return out


def requeue(wh: Warehouse, stage: Stage, keys: Sequence[str]) -> None:
    """Make job ``stage`` claimable again at once for ``keys``: its results and those of the
    stages that read them (``dependent_stages``) are cleared, their attempts and errors
    reset and any lease on them voided (``Warehouse.reset_job``), so a worker still holding
    one cannot write a result computed from the old inputs. Stages that are passes over the
    warehouse, not queue jobs (caption checks, coverage), get their columns cleared."""
    jobs = {j.name for j in wh.table(TABLE).jobs}
    passes = [s for s in dependent_stages(stage) if s.name not in jobs]
    if passes:
        cleared = {c: None for s in passes for c in s.columns}
        with wh.funnel() as f:
            f.patch(TABLE, [{KEY: k, **cleared} for k in keys])
            f.flush()
    for s in dependent_stages(stage):
        if s.name in jobs:
            wh.reset_job(TABLE, s.name, keys)


def ingest(
    wh: Warehouse,
    source: Path,
    name: str | None = None,
    all_files: bool = False,
) -> IngestResult:
    """List ``source`` (a directory, a ``.parquet`` or a URI list; ``krea2.curate.sources.
    list_source``) into the ``images`` table; returns what was listed, changed and skipped."""
    from krea2.curate.sources import list_source

    skipped = Skipped()
    result = ingest_rows(wh, list_source(source, name, all_files, skipped))
    result.skipped = skipped
    return result


def scan_table(
    wh: Warehouse, table: str, where: list, columns: list[str], page: int = 10_000
) -> Iterator[dict]:
    """Every row of ``table`` matching reader filters ``where``, page by page."""
    reader = wh.reader()
    cursor = None
    while True:
        rows, cursor = reader.scan(table, where=where, columns=columns, limit=page, cursor=cursor)
        yield from rows
        if cursor is None:
            return


def scan_all(wh: Warehouse, where: list, columns: list[str], page: int = 10_000) -> Iterator[dict]:
    """Every row of the ``images`` table matching reader filters ``where``, page by page."""
    return scan_table(wh, TABLE, where, columns, page)


def read_rows(wh: Warehouse, columns: Sequence[str] | None = None) -> list[dict]:
    """Every row with ``columns`` (default: all but the raw hash bytes) and the key."""
    cols = list(columns) if columns else [c for c in COLUMNS if c not in HASH_COLUMNS]
    return list(scan_all(wh, [], [KEY, *(c for c in cols if c != KEY)]))


def kept_rows(wh: Warehouse, columns: Sequence[str] | None = None) -> list[dict]:
    """The rows every stage run so far kept (``final_reason`` None, analysed), with
    ``columns`` (default: all but the raw hash bytes) and the key."""
    cols = list(columns) if columns else [c for c in COLUMNS if c not in HASH_COLUMNS]
    read = [*cols, *(c for c in ["md5", *reject_columns()] if c not in cols)]
    keep = [r for r in read_rows(wh, read) if final_reason(r) is None and r.get("md5")]
    return [{c: r[c] for c in [KEY, *cols]} for r in keep]


def run_worker(
    wh: Warehouse,
    stage: Stage,
    handler: type,
    *,
    batch_size: int = 32,
    lease_s: float | None = None,
    follow: bool = False,
    install_signals: bool = False,
    single_thread: bool = False,
) -> Any:
    """Run one krablet worker of job ``stage`` until its queue is empty (or, ``follow``,
    until stopped); ``single_thread`` keeps OpenCV and BLAS on the calling thread (one
    worker process per core). Returns the worker's stats."""
    if single_thread:
        from krea2.curate.threads import single_threaded

        single_threaded()
    worker = Worker(wh, TABLE, stage.name, handler, batch_size=batch_size, lease_s=lease_s)
    return worker.run(until_empty=not follow, install_signals=install_signals)


def stage_progress(wh: Warehouse, names: Sequence[str] | None = None) -> dict[str, tuple[int, int]]:
    """``{stage: (done, total)}`` for the stages called ``names`` (default: all), read from
    the warehouse: ``total`` rows match the stage's ``when``, less those it skipped
    (``skipped_rows``: nothing to do until their inputs change), and ``done`` of them carry
    its first result column. A stage is complete when ``done == total``; an interrupted or
    crashed run leaves ``done < total`` until a rerun finishes it."""
    reader = wh.reader()
    out: dict[str, tuple[int, int]] = {}
    for s in stages_named(names if names is not None else STAGE_NAMES):
        todo, done_filters = s.progress_filters()
        done, total = reader.count(TABLE, done_filters), reader.count(TABLE, todo)
        out[s.name] = (done, total - skipped_rows(wh, s, total - done))
    return out


def skipped_rows(wh: Warehouse, stage: Stage, undone: int | None = None) -> int:
    """How many rows job ``stage`` skipped: failed with its ``skips`` error
    (``plugins.NoCaption``), and not queued again since (a reset zeroes attempts).
    ``undone``: the rows of its ``when`` it has not done, if known (counted otherwise)."""
    if stage.skips is None:
        return 0
    if undone is None:
        todo, done = stage.progress_filters()
        undone = wh.reader().count(TABLE, todo) - wh.reader().count(TABLE, done)
    if undone <= 0:
        return 0
    queue = wh.queue(TABLE, stage.name)

    def skipped(error: str) -> bool:  # the worker records "module.Type: message"
        return error.split(": ", 1)[0].rsplit(".", 1)[-1] == stage.skips

    return sum(
        1
        for shard in range(len(wh.cluster))
        for row in queue.errors(shard, limit=undone)
        if row["attempts"] > 0 and skipped(str(row["last_error"]))
    )


def is_complete(wh: Warehouse, names: Sequence[str]) -> bool:
    """True when every stage called ``names`` has done all its rows (``stage_progress``)."""
    return all(done == total for done, total in stage_progress(wh, names).values())


# analyze's decode_error of an image whose isolated child ran out of time or died, twice
ISOLATION_FAILURES = ("timeout", "crashed")


def isolation_failures(wh: Warehouse) -> int:
    """Rows the analyze job gave up on after their child ran out of time or died twice
    (reject ``broken``; ``retry_isolation_failures`` queues them again)."""
    reader = wh.reader()
    return sum(reader.count(TABLE, [["decode_error", "=", e]]) for e in ISOLATION_FAILURES)


def retry_isolation_failures(wh: Warehouse) -> int:
    """Clear the analyze results of rows that timed out or crashed (a verdict of the machine's
    load as much as of the image), so the next analyze run claims them again; returns how
    many. Later stages never saw these rows (they were rejected), so nothing else changes."""
    cols = [KEY]
    keys = [
        r[KEY] for e in ISOLATION_FAILURES for r in scan_all(wh, [["decode_error", "=", e]], cols)
    ]
    if keys:
        cleared = dict.fromkeys(STAGES_BY_NAME["analyze"].columns)
        with wh.funnel() as f:
            f.patch(TABLE, [{KEY: k, **cleared} for k in keys])
            f.flush()
    return len(keys)


def check_stages(
    names: Sequence[str],
    tagger: str | None = None,
    captioner: str | None = None,
    embedder: str | None = None,
    heads: str | None = None,
) -> list[Stage]:
    """The stages called ``names``, after checking that each is known and that every plugin
    named (or needed by a chosen stage) is registered (an embedder: a well-formed
    ``KIND:PATH``); a user error names the fix."""
    chosen = stages_named(names)
    plugins = {"tagger": tagger, "captioner": captioner}
    for kind, name in plugins.items():
        if name not in (None, "none"):
            check_plugin(kind, name, needed_by=kind)
    if embedder not in (None, "none"):
        check_embedder(embedder, needed_by="embed")
    for s in chosen:
        if s.plugin == "embedder":
            check_embedder(embedder, needed_by=s.name)
        elif s.plugin == "heads":
            check_heads(heads, needed_by=s.name)
        elif s.plugin is not None:
            check_plugin(s.plugin, plugins[s.plugin], needed_by=s.name)
    return chosen


def run_stages(
    wh: Warehouse,
    names: Sequence[str],
    cfg: CurateConfig | None = None,
    *,
    tagger: str | None = None,
    captioner: str | None = None,
    embedder: str | None = None,
    heads: str | None = None,
    processes: int = 1,
    run_job: JobRunner | None = None,
    on_result: Callable[[Stage, Any], None] | None = None,
) -> dict[str, Any]:
    """Run the stages called ``names`` in order: a job through ``run_job(wh, stage,
    handler)`` (default: one ``run_worker``), a pass in this process. ``tagger`` and
    ``captioner`` name the plugins (``krea2.curate.plugins``) of the stages that need one,
    ``embedder`` the ``KIND:PATH`` of the embed stage's model, ``heads`` the head files of
    the classify stage;
    ``processes``: isolated decode processes of ``analyze``. Returns each stage's result
    (worker stats or the pass's counts), also handed to ``on_result`` as it finishes; a
    pass's counts are recorded in the warehouse too (``pass_results``)."""
    chosen = check_stages(names, tagger, captioner, embedder, heads)
    plugins = {"tagger": tagger, "captioner": captioner, "embedder": embedder, "heads": heads}
    cfg = cfg or CurateConfig()
    results: dict[str, Any] = {}
    for s in chosen:
        if s.kind is StageKind.JOB:
            plugin = plugins[s.plugin] if s.plugin is not None else ""
            handler = configured(load_object(s.run), cfg, plugin=plugin, processes=processes)
            results[s.name] = (run_job or run_worker)(wh, s, handler)
        else:
            results[s.name] = load_object(s.run)(wh, cfg)
            if isinstance(results[s.name], dict):
                record_pass_result(wh, s.name, results[s.name])
        if on_result is not None:
            on_result(s, results[s.name])
    return results
