"""Embeddings in pgvector for retrieval: a vector table on each row's shard, an index, and
top-k nearest by cosine across the shards.

The float16 store (``krea2.curate.embed.store``) stays the source of truth; the ``vectors``
pass copies the embedded rows' vectors into ``image_vectors(image_key, model, embedding
vector(d))`` on the shard that holds each row (``Cluster.shard_of``), so a retrieval query
can join the row it finds on the same shard. The table lives beside the krablet-managed
``images`` table, not in it, because its type depends on the embedder (``vector(d)``) and
krablet never rewrites a column's type: when the dimension changes, the pass drops and
rebuilds the table (it is a copy; nothing is lost). Rows whose ``vector_model`` already
equals their ``embed_model`` are skipped, so a rerun copies only what is new.

The embedded ``pgserver`` ships pgvector 0.6.2 (``CREATE EXTENSION vector``): the
``vector`` type (float32, so 4 B per dimension, twice the store), ``<=>`` cosine distance,
HNSW and IVFFlat indexes with ``vector_cosine_ops``, both limited to 2,000 dimensions.
Its ``halfvec`` type came in 0.7, so the table cannot keep the store's float16.

``nearest`` asks every shard for its ``k`` nearest (``ORDER BY embedding <=> q LIMIT k``,
which the index answers; ``hnsw.ef_search`` / ``ivfflat.probes`` set per query) and merges
them; approximate with an index, exact with ``index = "none"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TABLE = "image_vectors"
INDEXES = ("hnsw", "ivfflat", "none")
MAX_INDEXED_DIM = 2000  # pgvector 0.6's limit for HNSW and IVFFlat
MAX_EF_SEARCH = 1000  # pgvector's bound on hnsw.ef_search (an HNSW scan returns at most that)


@dataclass(frozen=True)
class Neighbour:
    """One retrieval result: the row's key, its URI and the cosine similarity to the query."""

    image_key: str
    uri: str | None
    similarity: float


def vector_literal(v: np.ndarray) -> str:
    """A vector as pgvector's text input, ``[x1,x2,...]`` (float32 values round-trip)."""
    return "[" + ",".join(map(repr, np.asarray(v, np.float32).astype(float).tolist())) + "]"


def require_extension(conn: Any, where: str) -> None:
    """``CREATE EXTENSION IF NOT EXISTS vector`` on one shard; a user error when the server
    has no pgvector to create."""
    from krea2.infra.errors import UserError

    available = conn.execute(
        "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
    ).fetchone()
    if available is None:
        raise UserError(
            f"{where} has no pgvector (`vector` is not among its available extensions): "
            "install it on that server (the embedded pgserver ships it), or skip the vectors stage"
        )
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")


def table_dim(conn: Any) -> int | None:
    """The dimension of ``image_vectors.embedding`` on this shard (None: no table)."""
    row = conn.execute(
        "SELECT a.atttypmod FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) "
        "AND a.attname = 'embedding' AND NOT a.attisdropped",
        (TABLE,),
    ).fetchone()
    return int(row[0]) if row else None


def ensure_table(conn: Any, dim: int) -> bool:
    """Create ``image_vectors`` for ``dim``-d vectors (dropping one of another dimension);
    returns True when the table was (re)created, so every row must be written again."""
    have = table_dim(conn)
    if have == dim:
        return False
    conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    conn.execute(
        f"CREATE TABLE {TABLE} (image_key text PRIMARY KEY, model text NOT NULL, "
        f"embedding vector({dim}) NOT NULL)"
    )
    return True


def ensure_index(conn: Any, kind: str, dim: int, cfg: Any) -> str | None:
    """The cosine index ``kind`` on this shard's table (the other kind dropped); returns
    its name (None for ``none``). IVFFlat is built once on the rows present (``lists``:
    ``cfg.lists``, or rows/1000, at least 1) and keeps its centroids as rows are added."""
    from krea2.infra.errors import UserError

    if kind not in INDEXES:
        raise UserError(f"vectors.index {kind!r}: use one of {', '.join(INDEXES)}")
    for other in ("hnsw", "ivfflat"):
        if other != kind:
            conn.execute(f"DROP INDEX IF EXISTS {TABLE}_{other}")
    if kind == "none":
        return None
    if dim > MAX_INDEXED_DIM:
        raise UserError(
            f"vectors.index {kind}: pgvector 0.6 indexes at most {MAX_INDEXED_DIM} dimensions, "
            f"these vectors have {dim}; set vectors.index=none (exact search)"
        )
    name = f"{TABLE}_{kind}"
    if kind == "hnsw":
        params = f"m = {cfg.m}, ef_construction = {cfg.ef_construction}"
    else:
        rows = conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]
        params = f"lists = {cfg.lists or max(1, rows // 1000)}"
    conn.execute(
        f"CREATE INDEX IF NOT EXISTS {name} ON {TABLE} "
        f"USING {kind} (embedding vector_cosine_ops) WITH ({params})"
    )
    return name


def write_vectors(conn: Any, keys: Sequence[str], models: Sequence[str], x: np.ndarray) -> None:
    """Upsert (n, d) ``x`` for rows ``keys`` (with their ``models``) into this shard's table."""
    sql = (
        f"INSERT INTO {TABLE} (image_key, model, embedding) VALUES (%s, %s, %s::vector) "
        "ON CONFLICT (image_key) DO UPDATE SET model = EXCLUDED.model, "
        "embedding = EXCLUDED.embedding"
    )
    with conn.cursor() as cur:
        cur.executemany(
            sql, [(k, m, vector_literal(v)) for k, m, v in zip(keys, models, x, strict=True)]
        )


def vectors_pass(wh: Any, cfg: Any) -> dict[str, Any]:
    """Copy every embedded row's vector into ``image_vectors`` on its shard (rows whose
    ``vector_model`` is already their ``embed_model`` are skipped unless a table was
    rebuilt), build the ``vectors.index`` index, and write ``vector_model``."""
    from krea2.curate.embed.store import read_vectors
    from krea2.curate.stages import STAGES_BY_NAME
    from krea2.curate.stages import TABLE as IMAGES
    from krea2.curate.warehouse import scan_all

    c = cfg.vectors
    cols = ["image_key", "embedding", "embed_model", "vector_model"]
    rows = sorted(
        scan_all(wh, STAGES_BY_NAME["vectors"].filters(), cols), key=lambda r: r["image_key"]
    )
    if not rows:
        return {"rows": 0, "written": 0}
    dim = len(read_vectors([rows[0]["embedding"]])[0])
    cluster = wh.cluster
    rebuilt = set()
    for i in range(len(cluster)):
        with cluster.connection(i) as conn:
            require_extension(conn, cluster.describe(i))
            if ensure_table(conn, dim):
                rebuilt.add(i)
    todo = [
        r
        for r in rows
        if r["vector_model"] != r["embed_model"] or cluster.shard_of(r["image_key"]) in rebuilt
    ]
    by_shard = cluster.split(r["image_key"] for r in todo)
    row_of = {r["image_key"]: r for r in todo}
    for shard, keys in by_shard.items():
        for start in range(0, len(keys), c.batch):
            part = [row_of[k] for k in keys[start : start + c.batch]]
            names = [r["image_key"] for r in part]
            models = [r["embed_model"] for r in part]
            x = read_vectors([r["embedding"] for r in part], names)
            with cluster.connection(shard) as conn, conn.transaction():
                write_vectors(conn, names, models, x)
            with wh.funnel() as f:  # after the copy: a crash in between only rewrites it
                f.patch(
                    IMAGES,
                    [
                        {"image_key": k, "vector_model": m}
                        for k, m in zip(names, models, strict=True)
                    ],
                )
                f.flush()
    for i in range(len(cluster)):
        with cluster.connection(i) as conn:
            ensure_index(conn, c.index, dim, c)
    return {"rows": len(rows), "written": len(todo), "dim": dim, "index": c.index}


def nearest(
    wh: Any, query: np.ndarray, k: int = 10, cfg: Any = None, model: str | None = None
) -> list[Neighbour]:
    """The ``k`` rows whose stored vectors are nearest ``query`` (d,) by cosine, best first,
    over every shard (``model``: only vectors of that embedder). ``cfg`` (a
    ``VectorConfig``) sets the search breadth: ``ef_search`` for HNSW, ``probes`` for
    IVFFlat (``ef_search`` at least ``k``, at most 1,000: an HNSW scan returns at most
    ``ef_search`` rows per shard, so ask ``index = "none"`` for more)."""
    from krea2.curate.config import VectorConfig
    from krea2.infra.errors import UserError

    cfg = cfg or VectorConfig()
    q = np.asarray(query, np.float32).reshape(-1)
    norm = float(np.linalg.norm(q))
    if norm == 0.0 or not np.isfinite(norm):
        raise UserError("nearest: the query vector is zero or not finite")
    lit = vector_literal(q / norm)
    where = "WHERE model = %s" if model else ""
    params: tuple = (lit, *((model,) if model else ()), k)
    sql = (
        "SELECT s.image_key, i.uri, 1 - s.d FROM ("
        f"SELECT image_key, embedding <=> %s::vector AS d FROM {TABLE} {where} "
        "ORDER BY d LIMIT %s) s LEFT JOIN images i USING (image_key) ORDER BY s.d"
    )
    found: list[Neighbour] = []
    cluster = wh.cluster
    for i in range(len(cluster)):
        with cluster.connection(i) as conn:
            dim = table_dim(conn)
            if dim is None:
                continue
            if dim != len(q):
                raise UserError(
                    f"nearest: the query has {len(q)} dimensions, {cluster.describe(i)} stores "
                    f"{dim}; embed the query with the embedder the vectors stage stored"
                )
            with conn.transaction():
                ef = min(MAX_EF_SEARCH, max(cfg.ef_search, k))
                conn.execute(f"SET LOCAL hnsw.ef_search = {ef}")
                conn.execute(f"SET LOCAL ivfflat.probes = {max(1, cfg.probes)}")
                found += [
                    Neighbour(key, uri, float(s)) for key, uri, s in conn.execute(sql, params)
                ]
    found.sort(key=lambda n: (-n.similarity, n.image_key))
    return found[:k]


def stored_vector(wh: Any, key: str) -> np.ndarray:
    """The vector ``image_vectors`` holds for row ``key`` (a user error when it has none)."""
    from krea2.infra.errors import UserError

    shard = wh.cluster.shard_of(key)
    with wh.cluster.connection(shard) as conn:
        row = None
        if table_dim(conn) is not None:
            row = conn.execute(
                f"SELECT embedding::text FROM {TABLE} WHERE image_key = %s", (key,)
            ).fetchone()
    if row is None:
        raise UserError(
            f"no stored vector for row {key!r}: give the image_key of an embedded row, and run "
            "`krea2 curate run --stages vectors` after the embed stage"
        )
    return np.asarray([float(v) for v in row[0].strip("[]").split(",")], np.float32)
