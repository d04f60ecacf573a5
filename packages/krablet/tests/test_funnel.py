"""The funnel: coalesced, sorted, batched writes; no-op updates skipped; bad input refused."""

from __future__ import annotations

import threading

import pytest

from krea2.infra.errors import UserError
from krea2.krablet import Table, Warehouse
from krea2.krablet.funnel import FunnelError

DOCS = Table(
    "docs",
    columns={"n": "bigint", "meta": "jsonb", "vec": "real[]", "tags": "text[]", "blob": "bytea"},
)


def rows_of(cluster, sql: str) -> list[tuple]:
    out = []
    for i in range(len(cluster)):
        with cluster.connect(i) as conn:
            out += conn.execute(sql).fetchall()
    return sorted(out)


def test_upserts_and_patches_land_on_the_right_shard_with_their_types(cluster):
    wh = Warehouse.open(cluster, tables=[DOCS])
    with wh.funnel() as f:
        f.upsert(
            "docs",
            [
                {
                    "key": f"k{i}",
                    "n": i,
                    "meta": {"i": i},
                    "vec": [0.5, i],
                    "tags": ["a", "b,c"],
                    "blob": b"\x00\x01",
                }
                for i in range(200)
            ],
        )
        f.patch("docs", [{"key": "k3", "n": 33}, {"key": "missing", "n": 1}])
    rows = dict(
        (r[0], r[1:]) for r in rows_of(cluster, "SELECT key, n, meta, vec, tags, blob FROM docs")
    )
    assert len(rows) == 200  # the patch of an unknown key inserted nothing
    assert rows["k3"][0] == 33
    assert rows["k7"][1:4] == ({"i": 7}, [0.5, 7.0], ["a", "b,c"])
    assert bytes(rows["k7"][4]) == b"\x00\x01"
    for i in range(2):
        with cluster.connect(i) as conn:
            for (key,) in conn.execute("SELECT key FROM docs").fetchall():
                assert cluster.shard_of(key) == i


def test_repeated_writes_coalesce_into_few_batches_last_write_wins(cluster1):
    wh = Warehouse.open(cluster1, tables=[DOCS])
    f = wh.funnel(linger_s=0.05)
    for v in range(500):
        f.upsert("docs", [{"key": "hot", "n": v}])
    f.flush()
    assert f.batches_written < 50
    f.close()
    assert rows_of(cluster1, "SELECT n FROM docs") == [(499,)]


def test_no_op_updates_do_not_write_a_new_row_version(cluster1):
    wh = Warehouse.open(cluster1, tables=[DOCS])
    with wh.funnel() as f:
        f.upsert("docs", [{"key": "a", "n": 1}])
        f.flush()
        before = rows_of(cluster1, "SELECT xmin::text FROM docs")
        f.upsert("docs", [{"key": "a", "n": 1}])
        f.patch("docs", [{"key": "a", "n": 1}])
        f.flush()
        assert rows_of(cluster1, "SELECT xmin::text FROM docs") == before
        f.upsert("docs", [{"key": "a", "n": 2}])
        f.flush()
        assert rows_of(cluster1, "SELECT xmin::text FROM docs") != before


def test_a_bad_value_is_refused_on_flush_and_other_writes_land(cluster1):
    wh = Warehouse.open(cluster1, tables=[DOCS])
    f = wh.funnel()
    f.upsert("docs", [{"key": "good", "n": 1}])
    f.flush()
    f.upsert("docs", [{"key": "bad", "n": "not a number"}])
    with pytest.raises(FunnelError, match="refused"):
        f.flush()
    f.upsert("docs", [{"key": "later", "n": 2}])
    f.close()
    assert rows_of(cluster1, "SELECT key FROM docs") == [("good",), ("later",)]


def test_a_batch_that_cannot_be_prepared_is_refused_without_stalling_the_writer(
    cluster1, monkeypatch
):
    from krea2.krablet import funnel as funnel_module

    prepare = funnel_module._ShardWriter._prepare

    def fussy(self, group, conn):  # e.g. keys of types that do not sort together
        if any(k == "bad" for k in group.rows):
            raise TypeError("'<' not supported between instances of 'int' and 'str'")
        return prepare(self, group, conn)

    monkeypatch.setattr(funnel_module._ShardWriter, "_prepare", fussy)
    wh = Warehouse.open(cluster1, tables=[DOCS])
    f = wh.funnel()
    f.upsert("docs", [{"key": "bad", "n": 1}])
    with pytest.raises(FunnelError, match="refused: '<' not supported"):
        f.flush(timeout=30)  # refused at once, not a dead writer's timeout
    f.upsert("docs", [{"key": "later", "n": 3}])
    f.close()
    assert rows_of(cluster1, "SELECT key FROM docs") == [("later",)]


def test_unknown_columns_and_missing_keys_fail_at_the_call(cluster1):
    wh = Warehouse.open(cluster1, tables=[DOCS])
    with wh.funnel() as f:
        with pytest.raises(UserError, match="no column 'nope'"):
            f.upsert("docs", [{"key": "a", "nope": 1}])
        with pytest.raises(UserError, match="no key"):
            f.upsert("docs", [{"n": 1}])
        with pytest.raises(UserError, match="no table"):
            f.upsert("ghost", [{"key": "a"}])


def test_concurrent_writers_to_overlapping_keys_do_not_deadlock(cluster1):
    wh = Warehouse.open(cluster1, tables=[DOCS])
    funnels = [wh.funnel(durable=False) for _ in range(4)]

    def write(f, seed: int) -> None:
        for r in range(20):
            f.upsert("docs", [{"key": f"k{(i * 7 + seed + r) % 300}", "n": r} for i in range(300)])
        f.flush()

    threads = [threading.Thread(target=write, args=(f, i)) for i, f in enumerate(funnels)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in funnels:
        f.close()
    assert len(rows_of(cluster1, "SELECT key FROM docs")) == 300
