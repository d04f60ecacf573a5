"""Embeddings in pgvector (the ``vectors`` pass) and retrieval by cosine, on real pgserver."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from krea2 import curate
from krea2.curate.cli import app
from krea2.curate.embed.store import write_batch
from krea2.curate.vectors import TABLE, nearest, stored_vector
from krea2.curate.warehouse import ingest_rows
from krea2.infra.errors import UserError


@pytest.fixture
def two_shards(pg_server, tmp_path) -> str:
    """A two-shard cluster file (two databases of the session's pgserver)."""
    from krea2.krablet.testing import fresh_cluster_file

    return str(fresh_cluster_file([pg_server, pg_server], tmp_path / "cluster.json"))


def _unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)


def _embedded(wh, store, n: int = 300, d: int = 32, model: str = "toy:a", seed: int = 0):
    """``n`` rows with stored ``d``-d vectors (as the embed job leaves them); their keys."""
    keys = [f"pool/img-{i:04d}" for i in range(n)]
    ingest_rows(wh, ({"image_key": k, "uri": f"file:///pool/{k}.png"} for k in keys))
    x = _unit(n, d, seed)
    refs = write_batch(store, keys, x)
    patch = [
        {"image_key": k, "embedding": r, "embed_model": model}
        for k, r in zip(keys, refs, strict=True)
    ]
    with wh.funnel() as f:
        f.patch(curate.TABLE, patch)
        f.flush()
    return keys, x.astype(np.float32)


def _cosines(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Cosine similarity of every row of ``x`` to ``q`` (float16 rows are not quite unit)."""
    return (x @ q) / (np.linalg.norm(x, axis=1) * np.linalg.norm(q))


def _exact_top(x: np.ndarray, q: np.ndarray, k: int) -> list[int]:
    return np.argsort(-_cosines(x, q), kind="stable")[:k].tolist()


def test_each_rows_vector_lands_on_its_own_shard_and_exact_search_equals_numpy(
    two_shards, tmp_path
):
    wh = curate.open_warehouse(two_shards)
    try:
        keys, x = _embedded(wh, tmp_path / "store")
        cfg = curate.load_curate_config(overrides=["vectors.index=none", "vectors.batch=64"])
        result = curate.run_stages(wh, ["vectors"], cfg)["vectors"]
        on_shard = {}
        for i in range(2):
            with wh.cluster.connection(i) as conn:
                on_shard[i] = {k for (k,) in conn.execute(f"SELECT image_key FROM {TABLE}")}
        for qi in (0, 17, 123):
            got = nearest(wh, x[qi], 10, cfg.vectors)
            assert [n.image_key for n in got] == [keys[j] for j in _exact_top(x, x[qi], 10)]
            assert got[0].similarity == pytest.approx(1.0, abs=1e-5)
            assert got[0].uri == f"file:///pool/{keys[qi]}.png"
            np.testing.assert_allclose(
                [n.similarity for n in got], np.sort(_cosines(x, x[qi]))[::-1][:10], atol=1e-5
            )
        back = stored_vector(wh, keys[5])
    finally:
        wh.close()
    assert result == {"rows": 300, "written": 300, "dim": 32, "index": "none"}
    assert on_shard[0] and on_shard[1] and on_shard[0] | on_shard[1] == set(keys)
    split = curate.open_warehouse(two_shards)
    assert all(split.cluster.shard_of(k) == i for i, ks in on_shard.items() for k in ks)
    split.close()
    np.testing.assert_array_equal(back, x[5])  # float16 values stored exactly in float32


def test_the_hnsw_index_answers_the_query_and_finds_the_exact_neighbours(cluster_file, tmp_path):
    wh = curate.open_warehouse(str(cluster_file))
    try:
        keys, x = _embedded(wh, tmp_path / "store")
        cfg = curate.load_curate_config(overrides=["vectors.index=hnsw"])
        assert curate.run_stages(wh, ["vectors"], cfg)["vectors"]["index"] == "hnsw"
        recall = []
        for qi in range(0, 300, 15):
            got = {n.image_key for n in nearest(wh, x[qi], 10, cfg.vectors)}
            recall.append(len(got & {keys[j] for j in _exact_top(x, x[qi], 10)}) / 10)
        with wh.cluster.connection(0) as conn, conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")  # a 300-row table is small
            plan = "\n".join(
                r[0]
                for r in conn.execute(
                    f"EXPLAIN SELECT image_key FROM {TABLE} "
                    "ORDER BY embedding <=> %s::vector LIMIT 10",
                    ("[" + ",".join(["0.1"] * 32) + "]",),
                )
            )
    finally:
        wh.close()
    assert "image_vectors_hnsw" in plan, plan
    assert np.mean(recall) >= 0.95, recall


def test_a_rerun_copies_only_new_models_and_a_new_dimension_rebuilds_the_table(
    cluster_file, tmp_path
):
    wh = curate.open_warehouse(str(cluster_file))
    cfg = curate.load_curate_config(overrides=["vectors.index=ivfflat", "vectors.lists=4"])
    try:
        keys, _ = _embedded(wh, tmp_path / "a", n=40, d=16)
        first = curate.run_stages(wh, ["vectors"], cfg)["vectors"]
        again = curate.run_stages(wh, ["vectors"], cfg)["vectors"]
        # Re-embedded with another model of another dimension: the table is rebuilt.
        keys, x = _embedded(wh, tmp_path / "b", n=40, d=24, model="toy:b", seed=1)
        rebuilt = curate.run_stages(wh, ["vectors"], cfg)["vectors"]
        got = nearest(wh, x[3], 1, cfg.vectors, model="toy:b")
        models = {r["vector_model"] for r in curate.read_rows(wh, ["vector_model"])}
        with pytest.raises(UserError, match="24"):
            nearest(wh, np.ones(16, np.float32), 1)
    finally:
        wh.close()
    assert (first["written"], again["written"], rebuilt["written"]) == (40, 0, 40)
    assert rebuilt["dim"] == 24 and rebuilt["index"] == "ivfflat"
    assert got[0].image_key == keys[3] and models == {"toy:b"}


def test_nearest_from_the_cli_by_row_key(cluster_file, tmp_path):
    c = str(cluster_file)
    wh = curate.open_warehouse(c)
    try:
        keys, x = _embedded(wh, tmp_path / "store", n=50, d=16)
        curate.run_stages(wh, ["vectors"], curate.load_curate_config())
    finally:
        wh.close()
    runner = CliRunner()
    out = runner.invoke(app, ["nearest", keys[7], "--k", "3", "--cluster", c])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == f"3 nearest of {keys[7]}"
    want = [keys[j] for j in _exact_top(x, x[7], 3)]
    assert [line.split()[1] for line in lines[1:]] == want
    assert lines[1].split()[0] == "1.0000"
    missing = runner.invoke(app, ["nearest", "pool/none", "--cluster", c])
    assert isinstance(missing.exception, UserError)  # the krea2 host prints it as one line
    assert "no stored vector for row 'pool/none'" in str(missing.exception)


def test_a_k_past_hnsw_search_bound_returns_every_row_instead_of_an_error(cluster_file, tmp_path):
    wh = curate.open_warehouse(str(cluster_file))
    try:
        keys, x = _embedded(wh, tmp_path / "store", n=50, d=16)
        curate.run_stages(wh, ["vectors"], curate.load_curate_config())
        got = nearest(wh, x[0], 1500)  # hnsw.ef_search is capped at pgvector's 1,000
    finally:
        wh.close()
    assert sorted(n.image_key for n in got) == sorted(keys)
