"""The curation DAG, declared once: every stage's kind, claim condition, columns and reject.

The ``images`` table, a row's final reason, ``krea2 curate run``'s dispatch and progress,
and the in-memory verdict are all derived from ``STAGES``:

    analyze  (job: every ingested row)
      → dedup    (pass: rows that passed the cheap filters; md5 + phash + colorhash + ladder)
        → ocr      (job: where dup_keep = TRUE)
          → tags     (job: where text_reject = ''; a tagger by name)
            → concepts (pass: tagged rows; cap over-represented tags)
          → captions (job: where text_reject = ''; a captioner by name)
            → caption_check (pass: captioned rows; consistently omitted attributes)
      → embed    (job: where dup_keep = TRUE; an embedder by spec, vectors to the store)
        → semantic (pass: embedded rows; semantic dedup within k-means leaves)
          → sae      (pass: embedded rows; SAE features, the artifact filter)
          → review   (pass: clustered rows; reviewers' dropped clusters)
            → coverage (pass: captioned rows; concepts found by full-text search, weights)
            → balance  (pass: clustered rows; balanced sampling over the hierarchy)
        → classify (job: embedded rows; distilled heads score the stored vectors)
        → vectors  (pass: embedded rows; copies into pgvector for retrieval)

A job is a krablet job (claimed row by row, parallel, resumable); a pass is an idempotent
recomputation over the warehouse, safe to rerun after a crash. ``captions`` claims the same
rows as ``tags``, not only the concept cap's keepers: the cap is a pass that a growing pool
recomputes, so its surplus is captioned too and stays ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from krea2.krablet import Job, Table

# The cheap filters (``krea2.curate.filters``) in the order they run: the first that fails is
# the analyze stage's reject reason; each writes a ``score_<name>`` column. Declared here, not
# in ``filters``, so that this declaration imports no pixel code (the CLI reads it).
CHEAP_FILTERS: tuple[str, ...] = (
    "resolution",
    "aspect_ratio",
    "animation",
    "noise",
    "laplacian",
    "entropy",
    "white_ratio",
    "black_ratio",
    "flat_color",
    "border",
    "complexity",
)

TABLE = "images"
KEY = "image_key"
INGEST_COLUMNS: dict[str, str] = {
    "uri": "text",
    "source": "text",
    "seq": "bigint",  # ingest order: ties in the dedup keep rule go to the earliest
    "meta": "jsonb",  # per-image metadata from ingest (a sidecar's JSON), NULL if none
}

Condition = tuple[str, str, Any]  # (column, op, value): op "=", "is" or "is not"


class StageKind(Enum):
    JOB = "job"  # a krablet job: rows claimed in batches by workers
    PASS = "pass"  # a global pass: one function over the warehouse


@dataclass(frozen=True)
class Reject:
    """How a row's reject reason is read from a stage's reject column: the column's value
    when it is non-empty text, or (``when_false``) that reason when a boolean keep column
    is FALSE."""

    column: str
    when_false: str | None = None

    def reason(self, row: Mapping[str, Any]) -> str | None:
        value = row.get(self.column)
        if self.when_false is not None:
            return self.when_false if value is False else None
        return value or None


@dataclass(frozen=True)
class Stage:
    """One stage of the DAG.

    ``columns``: its result columns and their SQL types (a job's first is its done marker).
    ``when``: the rows it works on, as reader filters over earlier stages' results (a job's
    claim condition; the rows a pass reads). ``reject``: how its verdict becomes a row's
    reject reason. ``run``: ``module:name`` of a job's handler class or a pass's function
    ``(warehouse, config) -> dict``. ``plugin``: the registry its work is looked up in by
    name (``tagger``, ``captioner``), if any. ``skips``: the error type with which a job
    fails rows it has nothing to do for until their inputs change (not counted as work left).
    """

    name: str
    kind: StageKind
    columns: dict[str, str]
    run: str
    when: tuple[Condition, ...] = ()
    reject: Reject | None = None
    inputs: tuple[str, ...] = ("uri",)
    lease_s: float = 60.0
    plugin: str | None = None
    skips: str | None = None

    def claim_sql(self) -> str | None:
        """``when`` as the SQL of a krablet claim predicate (None when it is empty)."""
        return " AND ".join(f"{c} {op.upper()} {sql_literal(v)}" for c, op, v in self.when) or None

    def filters(self) -> list[list]:
        """``when`` as reader filters (``Reader.scan``/``count``)."""
        return [list(c) for c in self.when]

    def progress_filters(self) -> tuple[list[list], list[list]]:
        """Reader filters of (the rows this job works on, those of them it has done)."""
        return self.filters(), [*self.filters(), [next(iter(self.columns)), "is not", None]]

    def job(self) -> Job:
        """The krablet job of a job stage."""
        from krea2.krablet import Job

        return Job(
            self.name,
            result=list(self.columns),
            where=self.claim_sql(),
            inputs=list(self.inputs),
            lease_s=self.lease_s,
            handler=self.run,
        )


def sql_literal(value: Any) -> str:
    """A condition's value as SQL: NULL, TRUE/FALSE, a number or a quoted string."""
    if value is None or isinstance(value, bool):
        return {None: "NULL", True: "TRUE", False: "FALSE"}[value]
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


ANALYZE_COLUMNS: dict[str, str] = {
    "md5": "text",
    "bytes": "bigint",
    "format": "text",
    "alpha": "text",  # how alpha was composited (decode.ALPHA_ON_*), NULL without alpha
    "width": "integer",
    "height": "integer",
    "decode_error": "text",
    "reject": "text",  # first failing cheap filter (or broken/truncated); NULL = passed
    "reason": "text",
    "phash8": "bytea",
    "phash12": "bytea",
    "colorhash": "bytea",
    "huehist": "bytea",
    "ladder": "bytea",  # crop ladder (krea2.curate.crop_ladder); NULL on rows analysed before it
    **{f"score_{f}": "real" for f in CHEAP_FILTERS},
}

STAGES: tuple[Stage, ...] = (
    Stage(
        "analyze",
        StageKind.JOB,
        ANALYZE_COLUMNS,
        run="krea2.curate.handlers:AnalyzeHandler",
        reject=Reject("reject"),
        lease_s=120.0,
    ),
    Stage(
        "dedup",
        StageKind.PASS,
        {
            "dup_keep": "boolean",
            "dup_kind": "text",  # '' for keepers, exact_duplicate / near_duplicate otherwise
            "dup_of": "text",
        },
        run="krea2.curate.passes:dedup_pass",
        when=(("reject", "is", None), ("md5", "is not", None)),
        reject=Reject("dup_kind"),
    ),
    Stage(
        "ocr",
        StageKind.JOB,
        {
            "text_area": "real",
            "ocr_text": "text",
            "text_chars": "integer",
            "text_lines": "integer",
            "text_height": "real",
            "text_reject": "text",  # '' = passed, else text_density / text_legibility
        },
        run="krea2.curate.handlers:OcrHandler",
        when=(("dup_keep", "=", True),),
        reject=Reject("text_reject"),
        lease_s=300.0,
    ),
    Stage(
        "tags",
        StageKind.JOB,
        {"tags": "text[]"},
        run="krea2.curate.handlers:TagHandler",
        when=(("text_reject", "=", ""),),
        plugin="tagger",
    ),
    Stage(
        "concepts",
        StageKind.PASS,
        {
            "concept_share": "real",
            "concept_keep": "boolean",
            "concept_over": "boolean",  # carries a concept above the cap's share
        },
        run="krea2.curate.passes:concept_pass",
        when=(("tags", "is not", None),),
        reject=Reject("concept_keep", when_false="overrepresented"),
    ),
    Stage(
        "captions",
        StageKind.JOB,
        {"captions": "jsonb"},  # [{format, text}, ...]; never empty (plugins.NoCaption)
        run="krea2.curate.handlers:CaptionHandler",
        when=(("text_reject", "=", ""),),
        inputs=("uri", "meta", "ocr_text"),
        plugin="captioner",
        skips="NoCaption",
    ),
    Stage(
        "caption_check",
        StageKind.PASS,
        {
            "caption_reject": "text",  # '' or caption_omission
            "caption_omits": "text",  # the consistently omitted attributes this one omits
        },
        run="krea2.curate.passes:caption_check_pass",
        when=(("captions", "is not", None),),
        reject=Reject("caption_reject"),
    ),
    # Embedding-level curation (part 2): after the DAG above, so a pool curated without an
    # embedder is unchanged; a row's semantic verdict is its last reason.
    Stage(
        "embed",
        StageKind.JOB,
        {"embedding": "text", "embed_model": "text"},  # '<file>.npy#<row>' in the store
        run="krea2.curate.handlers:EmbedHandler",
        when=(("dup_keep", "=", True),),
        lease_s=300.0,
        plugin="embedder",
    ),
    Stage(
        "semantic",
        StageKind.PASS,
        {
            "sem_keep": "boolean",
            "sem_kind": "text",  # '' for keepers, semantic_duplicate otherwise
            "sem_dup_of": "text",
            "sem_similarity": "real",  # cosine to the keeper it duplicates
            "cluster": "text",  # hierarchical k-means path, top level first: '2/17/305'
        },
        run="krea2.curate.passes:semantic_pass",
        when=(("embedding", "is not", None),),
        reject=Reject("sem_kind"),
    ),
    Stage(
        "sae",
        StageKind.PASS,
        {
            "sae_features": "text",  # dominant SAE features, most active first: '12,3,40'
            "sae_reject": "text",  # '' or sae_artifact (dominant feature is an artifact's)
        },
        run="krea2.curate.passes_embed:sae_pass",
        when=(("embedding", "is not", None),),
        reject=Reject("sae_reject"),
    ),
    Stage(
        "classify",
        StageKind.JOB,
        {"class_scores": "jsonb"},  # {task: calibrated probability} of each head
        run="krea2.curate.handlers:ClassifyHandler",
        when=(("embedding", "is not", None),),
        inputs=("embedding",),
        plugin="heads",
    ),
    Stage(
        "review",
        StageKind.PASS,
        {"cluster_reject": "text"},  # cluster_review: in a cluster a reviewer dropped
        run="krea2.curate.review:review_pass",
        when=(("cluster", "is not", None),),
        reject=Reject("cluster_reject"),
    ),
    Stage(
        "coverage",
        StageKind.PASS,
        {
            "concepts_found": "text[]",  # the concepts its captions mention (full-text search)
            "sample_weight": "real",  # > 1 for rows carrying a rare concept
        },
        run="krea2.curate.coverage:coverage_pass",
        when=(("captions", "is not", None),),
    ),
    Stage(
        "balance",
        StageKind.PASS,
        {"sample_keep": "boolean"},  # drawn by balanced sampling over the k-means hierarchy
        run="krea2.curate.passes_embed:balance_pass",
        when=(("cluster", "is not", None),),
        reject=Reject("sample_keep", when_false="unsampled"),
    ),
    Stage(
        "vectors",
        StageKind.PASS,
        {"vector_model": "text"},  # the embed_model whose vector image_vectors holds
        run="krea2.curate.vectors:vectors_pass",
        when=(("embedding", "is not", None),),
    ),
)
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
STAGES_BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
COLUMNS: dict[str, str] = {
    **INGEST_COLUMNS,
    **{c: t for s in STAGES for c, t in s.columns.items()},
}


def stages_named(names: Sequence[str]) -> list[Stage]:
    """The stages called ``names``, in the given order; a user error names unknown ones."""
    from krea2.infra.errors import UserError

    bad = [n for n in names if n not in STAGE_NAMES]
    if bad:
        raise UserError(f"unknown stage(s) {bad}; choose from {list(STAGE_NAMES)}")
    return [STAGES_BY_NAME[n] for n in names]


def images_table() -> Table:
    """The ``images`` table: ingest columns, every stage's results, a job per job stage."""
    from krea2.krablet import Table

    return Table(
        TABLE,
        key=KEY,
        columns=COLUMNS,
        jobs=[s.job() for s in STAGES if s.kind is StageKind.JOB],
        indexes=["md5"],
    )


CLUSTERS = "clusters"


def clusters_table() -> Table:
    """``clusters``: one row per k-means cluster path (top level first, ``/``-separated),
    the review queue of ``krea2.curate.review``."""
    from krea2.krablet import Table

    return Table(
        CLUSTERS,
        key="cluster",
        columns={
            "level": "integer",  # 1 = top; the leaf level is the path's length
            "size": "bigint",  # rows in the cluster and below
            "name": "text",  # given by a namer (a VLM on the images nearest its centroid)
            "flag": "text",  # why it needs a look; '' or NULL = nothing
            "decision": "text",  # keep / drop / '' (pending)
            "note": "text",
        },
    )


def final_reason(row: Mapping[str, Any]) -> str | None:
    """A row's reject reason in DAG order (None = kept so far)."""
    for s in STAGES:
        if s.reject is not None and (reason := s.reject.reason(row)):
            return reason
    return None


def reject_columns() -> list[str]:
    """The columns ``final_reason`` reads."""
    return [s.reject.column for s in STAGES if s.reject is not None]


def reason_before(row: dict, stage: str) -> str | None:
    """The row's reject reason from the stages before ``stage`` (DAG order), or None."""
    for s in STAGES:
        if s.name == stage:
            return None
        if s.reject is not None and (reason := s.reject.reason(row)):
            return reason
    return None
