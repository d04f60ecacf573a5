"""The curate warehouse: the ``images`` table, its krablet jobs, and their handlers.

Jobs form a DAG through their claim predicates:

    analyze (every ingested row)
      → dedup (global pass: md5 + phash + colorhash over rows that passed the cheap filters)
        → ocr   (where dup_keep = TRUE)
          → tags (where text_reject = '')
            → concepts (global pass: cap over-represented tags)

``analyze`` reads each file once (md5, size, format, the one decode, every cheap filter and
hash); ``ocr`` and ``tags`` decode again at their own size. The two global passes are
idempotent recomputations over the warehouse, safe to rerun after a crash.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from krea2.curate.config import CurateConfig
from krea2.curate.filters import CHEAP_FILTERS
from krea2.krablet import Job, Table, Warehouse

TABLE = "images"
ANALYZE_RESULTS = [
    "md5",
    "bytes",
    "format",
    "width",
    "height",
    "decode_error",
    "reject",
    "reason",
    "phash8",
    "phash12",
    "colorhash",
    "huehist",
    *(f"score_{f}" for f in CHEAP_FILTERS),
]
OCR_RESULTS = ["text_area", "ocr_text", "text_chars", "text_lines", "text_height", "text_reject"]

COLUMNS: dict[str, str] = {
    "uri": "text",
    "source": "text",
    "seq": "bigint",  # ingest order: ties in the dedup keep rule go to the earliest
    "md5": "text",
    "bytes": "bigint",
    "format": "text",
    "width": "integer",
    "height": "integer",
    "decode_error": "text",
    "reject": "text",  # first failing cheap filter (or broken/truncated); NULL = passed
    "reason": "text",
    "phash8": "bytea",
    "phash12": "bytea",
    "colorhash": "bytea",
    "huehist": "bytea",
    **{f"score_{f}": "real" for f in CHEAP_FILTERS},
    "dup_keep": "boolean",
    "dup_kind": "text",  # '' for keepers, exact_duplicate / near_duplicate otherwise
    "dup_of": "text",
    "text_area": "real",
    "ocr_text": "text",
    "text_chars": "integer",
    "text_lines": "integer",
    "text_height": "real",
    "text_reject": "text",  # '' = passed, else text_density / text_legibility
    "tags": "text[]",
    "concept_share": "real",
    "concept_keep": "boolean",
    "concept_over": "boolean",  # carries a concept above the cap's share
}


def images_table() -> Table:
    """The ``images`` table with the ``analyze``, ``ocr`` and ``tags`` jobs."""
    return Table(
        TABLE,
        key="image_key",
        columns=COLUMNS,
        jobs=[
            Job(
                "analyze",
                result=ANALYZE_RESULTS,
                inputs=["uri"],
                lease_s=120.0,
                handler="krea2.curate.jobs:AnalyzeHandler",
            ),
            Job(
                "ocr",
                result=OCR_RESULTS,
                where="dup_keep = TRUE",
                inputs=["uri"],
                lease_s=300.0,
                handler="krea2.curate.jobs:OcrHandler",
            ),
            Job(
                "tags",
                result=["tags"],
                where="text_reject = ''",
                inputs=["uri"],
                handler="krea2.curate.jobs:ShapesTagHandler",
            ),
        ],
        indexes=["md5"],
    )


def final_reason(row: dict) -> str | None:
    """A row's reject reason in DAG order (None = kept so far)."""
    if row.get("reject"):
        return row["reject"]
    if row.get("dup_kind"):
        return row["dup_kind"]
    if row.get("text_reject"):
        return row["text_reject"]
    if row.get("concept_keep") is False:
        return "overrepresented"
    return None


# -- analyze ------------------------------------------------------------------------------------


def analyze_uri(args: tuple[str, CurateConfig]) -> dict[str, Any]:
    """Child-process work of the analyze job: read, decode once, filter, hash."""
    from krea2.curate.analysis import analyze_bytes
    from krea2.curate.storage import read_uri

    uri, cfg = args
    data = read_uri(uri)
    row = analyze_bytes(data, cfg).columns()
    row["bytes"] = len(data)
    return {k: row.get(k) for k in ANALYZE_RESULTS}


class AnalyzeHandler:
    """Batch handler of ``images.analyze``. Decodes run in ``processes`` isolated children
    (time bound ``timeout_s``, address space ``memory_mb``); a child that does not answer
    gives that image ``decode_error = 'timeout'``. Unreadable URIs fail the row (retried)."""

    cfg: ClassVar[CurateConfig] = CurateConfig()
    processes: ClassVar[int] = 1
    memory_mb: ClassVar[int] = 3072

    def setup(self) -> None:
        from krea2.curate.analysis import warm_up
        from krea2.curate.isolation import IsolatedPool
        from krea2.infra.metrics import counter

        # Compiled here first, so the children load the machine code instead of each
        # compiling it while an image's time bound runs.
        warm_up()
        timeout = self.cfg.decode.max_seconds
        self.pool = IsolatedPool(self.processes, timeout, self.memory_mb, warm_up=warm_up)
        self.verdicts = counter(
            "curate", "analyzed_total", "Images analyzed, by cheap verdict", ["reject"]
        )

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        from krea2.curate.isolation import IsolationTimeout

        out: list[dict | Exception] = []
        results = self.pool.map(analyze_uri, [(r["uri"], self.cfg) for r in rows])
        for row, res in zip(rows, results, strict=True):
            if isinstance(res, IsolationTimeout):
                res = {k: None for k in ANALYZE_RESULTS} | {
                    "md5": "",
                    "decode_error": "timeout",
                    "reject": "broken",
                    "reason": str(res),
                }
                try:  # the file was readable: record its md5 and size anyway
                    from krea2.curate.hashes import md5
                    from krea2.curate.storage import read_uri

                    data = read_uri(row["uri"])
                    res["md5"], res["bytes"] = md5(data), len(data)
                except OSError:
                    pass
            if isinstance(res, dict):
                self.verdicts.labels(res.get("reject") or "kept").inc()
            out.append(res)
        return out


# -- ocr and tags -------------------------------------------------------------------------------


class OcrHandler:
    """Batch handler of ``images.ocr``: one rapidocr engine per slot."""

    cfg: ClassVar[CurateConfig] = CurateConfig()

    def setup(self) -> None:
        from krea2.curate.ocr import OcrEngine

        self.engine = OcrEngine(min_score=self.cfg.ocr.min_score)

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        from krea2.curate.decode import DecodeError
        from krea2.curate.pipeline import ocr_image
        from krea2.curate.storage import read_uri

        out: list[dict | Exception] = []
        for row in rows:
            try:
                result, filters = ocr_image(read_uri(row["uri"]), self.cfg, self.engine)
            except (OSError, DecodeError) as exc:
                out.append(exc)
                continue
            failed = next((f.name for f in filters if not f.passed), "")
            out.append(
                {
                    "text_area": result.box_area_fraction,
                    "ocr_text": result.text,
                    "text_chars": result.char_count,
                    "text_lines": result.line_count,
                    "text_height": result.median_line_height,
                    "text_reject": failed,
                }
            )
        return out


class ShapesTagHandler:
    """Batch handler of ``images.tags`` with the ShapesWorld tagger (colour+shape pairs)."""

    cfg: ClassVar[CurateConfig] = CurateConfig()

    def __call__(self, rows: list[dict]) -> list[dict | Exception]:
        from krea2.curate.analysis import decode_limits
        from krea2.curate.decode import DecodeError, decode
        from krea2.curate.storage import read_uri
        from krea2.curate.tagging import shapes_tagger

        out: list[dict | Exception] = []
        for row in rows:
            try:
                pixels = decode(read_uri(row["uri"]), decode_limits(self.cfg)).pixels
            except (OSError, DecodeError) as exc:
                out.append(exc)
                continue
            out.append({"tags": sorted(shapes_tagger(pixels))})
        return out


def configured(handler: type, cfg: CurateConfig, **attrs: Any) -> type:
    """A subclass of ``handler`` bound to ``cfg`` (krablet instantiates handler classes)."""
    return type(handler.__name__, (handler,), {"cfg": cfg, **attrs})


# -- global passes --------------------------------------------------------------------------------


def scan_all(wh: Warehouse, where: list, columns: list[str], page: int = 10_000) -> Iterable[dict]:
    reader = wh.reader()
    cursor = None
    while True:
        rows, cursor = reader.scan(TABLE, where=where, columns=columns, limit=page, cursor=cursor)
        yield from rows
        if cursor is None:
            return


def dedup_pass(wh: Warehouse, cfg: CurateConfig) -> dict[str, int]:
    """Recompute duplicate groups over every analyzed row that passed the cheap filters and
    write ``dup_keep``/``dup_kind``/``dup_of``. Rows are ordered by ingest ``seq``."""
    from krea2.curate.dedup import dedup_configured

    cols = ["image_key", "seq", "md5", "width", "height", "phash8", "phash12", "colorhash",
            "huehist"]  # fmt: skip
    rows = list(scan_all(wh, [["reject", "is", None], ["md5", "is not", None]], cols))
    if not rows:
        return {"rows": 0, "duplicates": 0}
    rows.sort(key=lambda r: (r["seq"] if r["seq"] is not None else 0, r["image_key"]))

    def stack(col: str, n: int) -> np.ndarray:
        return np.stack([np.frombuffer(bytes(r[col]), np.uint8)[:n] for r in rows])

    areas = np.asarray([(r["width"] or 0) * (r["height"] or 0) for r in rows], np.int64)
    result = dedup_configured(
        [r["md5"] for r in rows],
        stack("phash12", 18),
        stack("colorhash", 6),
        stack("phash8", 8),
        areas,
        stack("huehist", 19),
        cfg.dedup,
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
    return {"rows": len(rows), "duplicates": int((~result.keep).sum())}


def concept_pass(wh: Warehouse, cfg: CurateConfig) -> dict[str, int]:
    """Recompute the over-represented-concept cap over every tagged row."""
    from krea2.curate.concepts import rebalance

    rows = list(scan_all(wh, [["tags", "is not", None]], ["image_key", "tags"]))
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


def ingest_rows(wh: Warehouse, rows: Iterable[dict], batch: int = 5000) -> int:
    """Upsert listed rows (key, uri, source) with an ingest sequence number; idempotent for
    keys already present (their results are untouched)."""
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


def open_warehouse(cluster: str | None) -> Warehouse:
    """Open (and migrate) the warehouse holding the ``images`` table."""
    from krea2.krablet.cluster import default_cluster_source

    return Warehouse.open(default_cluster_source(cluster), tables=[images_table()])


def with_stage(cfg: CurateConfig, stage: str | None) -> CurateConfig:
    return replace(cfg, stage=stage) if stage else cfg
