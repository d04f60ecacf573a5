"""RPC reads and the funnel service over loopback: same API as in-process, bad input refused."""

from __future__ import annotations

import httpx
import pytest

from krea2.infra.errors import UserError
from krea2.krablet import FunnelClient, RpcClient, Table, Warehouse
from krea2.krablet.cluster import Cluster
from krea2.krablet.service import Served, check_bind, make_funnel_app, make_rpc_app

IMAGES = Table("images", columns={"width": "integer", "src": "text", "raw": "bytea"})


@pytest.fixture
def served(cluster3):
    wh = Warehouse.open(cluster3, tables=[IMAGES])
    rpc = Served(make_rpc_app(wh, token="s3cret"))
    fun = Served(make_funnel_app(wh, token="s3cret"))
    yield wh, rpc, fun
    rpc.close()
    fun.close()
    wh.close()


def test_funnel_service_and_rpc_reads_match_the_in_process_api(served):
    wh, rpc, fun = served
    with FunnelClient(fun.url, token="s3cret") as f:
        f.upsert(
            "images",
            [
                {
                    "key": f"k{i:04d}",
                    "width": i % 100,
                    "src": "a" if i % 3 else "b",
                    "raw": bytes([i % 256]),
                }
                for i in range(1000)
            ],
        )
        f.flush()
    local, remote = wh.reader(), RpcClient(rpc.url, token="s3cret")
    for reader in (local, remote):
        got = reader.get("images", ["k0005", "k0999", "nope"], columns=["width", "raw"])
        assert sorted(got) == ["k0005", "k0999"]
        assert got["k0005"]["width"] == 5 and bytes(got["k0005"]["raw"]) == b"\x05"
        seen, cursor = [], None
        while True:
            rows, cursor = reader.scan(
                "images", where=[("width", ">=", 50)], columns=["width"], limit=128, cursor=cursor
            )
            seen += [r["key"] for r in rows]
            if cursor is None:
                break
        assert seen == sorted(f"k{i:04d}" for i in range(1000) if i % 100 >= 50)
        assert reader.count("images", where=[("src", "=", "b")]) == 334
        agg = reader.aggregate(
            "images",
            {"n": ("count", "*"), "max": ("max", "width"), "avg": ("avg", "width")},
            where=[("src", "in", ["a", "b"])],
        )
        assert agg["n"] == 1000 and agg["max"] == 99 and abs(agg["avg"] - 49.5) < 1e-9
    remote.close()


def test_malformed_requests_get_a_4xx_and_change_nothing(served):
    wh, rpc, fun = served
    auth = {"authorization": "Bearer s3cret"}
    r = httpx.post(fun.url + "/v1/upsert", content=b"{not json", headers=auth)
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]
    r = httpx.post(
        fun.url + "/v1/upsert",
        json={
            "table": "images",
            "rows": [{"key": "a", "width": 1}, {"key": "b", "height; DROP TABLE images": 2}],
        },
        headers=auth,
    )
    assert r.status_code == 400 and "no column" in r.json()["error"]
    r = httpx.post(
        rpc.url + "/v1/scan",
        json={"table": "images", "where": [["width", "; --", 1]]},
        headers=auth,
    )
    assert r.status_code == 400 and "op" in r.json()["error"]
    r = httpx.post(rpc.url + "/v1/count", json={"table": "pg_authid"}, headers=auth)
    assert r.status_code == 400
    r = httpx.post(rpc.url + "/v1/count", json={"table": "images"})
    assert r.status_code == 401
    FunnelClient(fun.url, token="s3cret").flush()
    assert wh.reader().count("images") == 0  # the half-valid upsert wrote nothing


def test_a_database_refusal_is_a_422_with_the_reason(served):
    _, _, fun = served
    f = FunnelClient(fun.url, token="s3cret")
    f.upsert("images", [{"key": "a", "width": "wide"}])
    with pytest.raises(UserError, match=r"422.*refused"):
        f.flush()


def test_binding_beyond_loopback_needs_a_token():
    check_bind("127.0.0.1", None)
    with pytest.raises(UserError, match="token"):
        check_bind("0.0.0.0", None)


def test_connection_errors_never_show_the_password():
    c = Cluster(["postgresql://u:hunter2@127.0.0.1:1/db?connect_timeout=1"])
    with pytest.raises(UserError) as err:
        c.connect(0)
    assert "hunter2" not in str(err.value) and "***" in str(err.value)
