"""The funnel's fast path: columns packed as binary arrays in bulk reach Postgres exactly as
psycopg would send them; whatever the packer does not cover goes through psycopg unchanged;
batches merged into one statement still refuse only the bad batch; a restart is survived."""

from __future__ import annotations

import datetime as dt
import math
import shutil
import tempfile
from pathlib import Path
from types import MappingProxyType

import psycopg
import pytest

from krea2.krablet import Table, Warehouse
from krea2.krablet.binary import Encoded, encode, register
from krea2.krablet.embedded import start_shard, stop_shard
from krea2.krablet.funnel import FunnelError

TYPED = Table(
    "typed",
    key="id",
    key_type="bigint",
    columns={
        "i8": "bigint",
        "i4": "integer",
        "i2": "smallint",
        "f8": "double precision",
        "f4": "real",
        "ok": "boolean",
        "t": "text",
        "b": "bytea",
        "j": "jsonb",
        "a": "text[]",
        "ts": "timestamptz",
    },
)

CASES = [
    ("bigint", [0, -1, 2**63 - 1, -(2**63), None, 7]),
    ("integer", [2**31 - 1, -(2**31), None]),
    ("smallint", [2**15 - 1, -(2**15), 0]),
    ("double precision", [0.1, -0.0, math.inf, 1e308, 3.0, None]),
    ("double precision", [3, None, 2**60 + 1, -(2**80) - 1]),
    ("real", [0.1, 3.4e38, -math.inf, None]),
    ("boolean", [True, False, None]),
    ("text", ["", "héllo ✓", 'a,b{c}"d\\', None, "x" * 5000]),
    ("bytea", [b"", b"\x00\x01\xff", None]),
    ("bigint", []),
]


def one_shard(cluster1) -> str:
    return cluster1.shards[0]


@pytest.mark.parametrize(("typ", "values"), CASES)
def test_a_packed_array_reads_back_as_psycopg_sends_it(cluster1, typ, values):
    packed = encode(typ, values)
    assert isinstance(packed, Encoded)
    with psycopg.connect(one_shard(cluster1), autocommit=True) as conn:
        register(conn)
        query = f"SELECT x FROM unnest(%(p)s::{typ}[]) WITH ORDINALITY AS u(x, n) ORDER BY n"
        ours = conn.execute(query, {"p": packed}).fetchall()
        theirs = conn.execute(query, {"p": values}).fetchall()
    assert ours == theirs
    assert len(ours) == len(values)


@pytest.mark.parametrize(
    ("typ", "values"),
    [
        ("bigint", [1, True]),  # bool is not an int here: psycopg sends a boolean
        ("bigint", [2.5]),  # psycopg sends float8 and the server rounds
        ("double precision", [1, 2.5]),  # psycopg refuses mixed types
        ("bigint", ["12"]),  # text the server parses
        ("bigint", [2**63]),  # out of range: the server says so
        ("integer", [2**31]),
        ("smallint", [2**15]),
        ("real", [1]),  # packing an int as float4 rounds twice
        ("real", [1e300]),
        ("boolean", [1]),
        ("text", ["a\x00b"]),  # psycopg refuses NUL itself
        ("text", ["\udc80"]),  # a lone surrogate
        ("text", [b"bytes"]),
        ("bytea", [bytearray(b"x")]),
        ("timestamptz", [dt.datetime.now(dt.UTC)]),  # not packed: psycopg adapts it
    ],
)
def test_what_the_packer_does_not_reproduce_exactly_is_left_to_psycopg(typ, values):
    assert encode(typ, values) is None


def test_text_is_packed_only_for_a_utf8_connection():
    assert encode("text", ["é"], utf8=False) is None
    assert encode("bytea", [b"\xe9"], utf8=False) is not None


def read_typed(cluster) -> dict:
    with cluster.connect(0) as conn:
        cols = ", ".join(["id", *TYPED.columns])
        rows = conn.execute(f"SELECT {cols} FROM typed ORDER BY id").fetchall()
    return {r[0]: dict(zip(["id", *TYPED.columns], r, strict=True)) for r in rows}


def test_every_column_type_lands_through_the_funnel_nulls_included(cluster1):
    wh = Warehouse.open(cluster1, tables=[TYPED])
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    full = {
        "i8": 2**62,
        "i4": -5,
        "i2": 7,
        "f8": 0.1,
        "f4": 0.5,
        "ok": True,
        "t": "héllo",
        "b": b"\x00\xff",
        "j": {"k": [1, None]},
        "a": ["x", "y,z"],
        "ts": when,
    }
    with wh.funnel() as f:
        f.upsert("typed", [{"id": 1, **full}, {"id": 2, **dict.fromkeys(full)}])
        f.upsert("typed", [MappingProxyType({"id": 3, "t": "from a mapping"})])
    rows = read_typed(cluster1)
    got = rows[1]
    assert {k: got[k] for k in ("i8", "i4", "i2", "f8", "f4", "ok", "t", "j", "a")} == {
        k: full[k] for k in ("i8", "i4", "i2", "f8", "f4", "ok", "t", "j", "a")
    }
    assert bytes(got["b"]) == b"\x00\xff"
    assert got["ts"] == when
    assert all(v is None for k, v in rows[2].items() if k != "id")
    assert rows[3]["t"] == "from a mapping"


def test_values_psycopg_adapts_differently_land_as_before(cluster1):
    wh = Warehouse.open(cluster1, tables=[TYPED])
    with wh.funnel() as f:
        f.upsert("typed", [{"id": 1, "i8": 2.6, "f8": 2**70}, {"id": "2", "i8": "41"}])
    rows = read_typed(cluster1)
    assert rows[1]["i8"] == 3  # float8 rounded by the server's cast, as psycopg sent it
    assert rows[1]["f8"] == float(2**70)
    assert rows[2]["i8"] == 41


def test_writes_to_one_key_apply_in_order_across_column_sets(cluster1):
    wh = Warehouse.open(cluster1, tables=[TYPED])
    with wh.funnel(writers_per_shard=4) as f:
        for i in range(50):
            f.upsert("typed", [{"id": k, "i8": i} for k in range(100)])
            f.upsert("typed", [{"id": k, "t": f"v{i}"} for k in range(100)])
            f.patch("typed", [{"id": k, "i8": i, "i4": i} for k in range(0, 100, 2)])
        f.upsert("typed", [{"id": k, "i8": -1} for k in range(100)])
    rows = read_typed(cluster1)
    assert {r["i8"] for r in rows.values()} == {-1}
    assert {r["t"] for r in rows.values()} == {"v49"}
    assert {r["i4"] for k, r in rows.items() if k % 2 == 0} == {49}


def test_a_row_dict_reused_with_a_new_column_is_read_afresh(cluster1):
    wh = Warehouse.open(cluster1, tables=[TYPED])

    def rows():
        row = {"id": 1, "i8": 1}
        yield row
        row.update(id=2, t="added")  # the same dict object, now with one more column
        yield row

    with wh.funnel() as f:
        assert f.upsert("typed", rows()) == 2
    got = read_typed(cluster1)
    assert (got[1]["i8"], got[1]["t"]) == (1, None)
    assert (got[2]["i8"], got[2]["t"]) == (1, "added")


def test_a_bad_batch_merged_into_one_statement_is_refused_alone(cluster1):
    wh = Warehouse.open(cluster1, tables=[TYPED])
    f = wh.funnel(max_batch=10, statements_per_commit=8, writers_per_shard=1, linger_s=0.05)
    rows = [{"id": k, "i4": k} for k in range(80)]
    rows[33]["i4"] = 2**40  # out of range for integer: its batch of 10 is refused
    f.upsert("typed", rows)
    with pytest.raises(FunnelError, match=r"\(10 rows\) refused: .*out of range"):
        f.flush()
    f.close()
    assert len(read_typed(cluster1)) == 70


def test_the_fast_path_survives_a_postgres_restart():
    root = Path(tempfile.mkdtemp(prefix="krablet-funnel-", dir="/tmp"))
    root.chmod(0o755)
    try:
        dsn = start_shard(root / "pg")
        wh = Warehouse.open([dsn], tables=[TYPED])
        f = wh.funnel(writers_per_shard=2)
        f.upsert("typed", [{"id": k, "i8": k} for k in range(100)])
        f.flush()  # connections are open and their statements prepared
        assert stop_shard(root / "pg", mode="fast")
        start_shard(root / "pg")
        f.upsert("typed", [{"id": k, "i8": -k} for k in range(100)])
        f.flush(timeout=60)
        f.close()
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT sum(i8), count(*) FROM typed").fetchone() == (-4950, 100)
        wh.close()
    finally:
        stop_shard(root / "pg", mode="immediate")
        shutil.rmtree(root, ignore_errors=True)
