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
from pathlib import Path
from typing import Any

from krea2.curate.config import CurateConfig
from krea2.curate.handlers import configured
from krea2.curate.plugins import check_embedder, check_heads, check_plugin, load_object
from krea2.curate.stages import (
    COLUMNS,
    KEY,
    STAGE_NAMES,
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
from krea2.krablet import Warehouse, Worker

# Columns a plain read leaves out: raw hash bytes, only the dedup pass reads them.
HASH_COLUMNS = ("phash8", "phash12", "colorhash", "huehist")

JobRunner = Callable[[Warehouse, Stage, type], Any]


def open_warehouse(cluster: str | None) -> Warehouse:
    """Open (and migrate) the warehouse holding the ``images`` table (and ``clusters``, the
    k-means review queue, ``krea2.curate.review``); ``cluster`` is a
    cluster file or comma-separated DSNs (default: ``$KRABLET_CLUSTER``)."""
    from krea2.krablet import default_cluster_source

    tables = [images_table(), clusters_table()]
    return Warehouse.open(default_cluster_source(cluster), tables=tables)


def ingest_rows(wh: Warehouse, rows: Iterable[dict], batch: int = 5000) -> int:
    """Upsert listed rows (key, uri, source, meta) with an ingest sequence number;
    idempotent for keys already present (their stage results are untouched)."""
    base = time.time_ns() // 1000
    n = 0
    with wh.funnel() as f:
        chunk: list[dict] = []
        for row in rows:
            chunk.append(row | {"seq": base + n})
            n += 1
            if len(chunk) >= batch:
                f.upsert(TABLE, chunk)
                chunk = []
        if chunk:
            f.upsert(TABLE, chunk)
        f.flush()
    return n


def ingest(wh: Warehouse, source: Path, name: str | None = None, all_files: bool = False) -> int:
    """List ``source`` (a directory, a ``.parquet`` or a URI list; ``krea2.curate.sources.
    list_source``) into the ``images`` table; returns the number of rows."""
    from krea2.curate.sources import list_source

    return ingest_rows(wh, list_source(source, name, all_files))


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
    the warehouse: ``total`` rows match the stage's ``when``, ``done`` of them carry its first
    result column. A stage is complete when ``done == total``; an interrupted or crashed run
    leaves ``done < total`` until a rerun finishes it."""
    reader = wh.reader()
    out: dict[str, tuple[int, int]] = {}
    for s in stages_named(names if names is not None else STAGE_NAMES):
        todo, done = s.progress_filters()
        out[s.name] = (reader.count(TABLE, done), reader.count(TABLE, todo))
    return out


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
    (worker stats or the pass's counts), also handed to ``on_result`` as it finishes."""
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
        if on_result is not None:
            on_result(s, results[s.name])
    return results
