"""RPC reads and the funnel service over loopback: same API as in-process, bad input refused."""

from __future__ import annotations

import socket

import httpx
import pytest

from krea2.infra.errors import UserError
from krea2.krablet import FunnelClient, RpcClient, Table, Warehouse
from krea2.krablet.cluster import Cluster
from krea2.krablet.service import MAX_BODY, Served, check_bind, make_funnel_app, make_rpc_app

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


def raw_request(url: str, head: str, body: bytes = b"") -> str:
    """Send ``head`` (request line and headers) and ``body`` on a raw socket without ending
    the body, and return the status line: the answer must come before the body does."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        return sock.makefile("rb").readline().decode().strip()


def test_an_oversized_body_is_refused_before_it_is_read(served):
    _, rpc, _ = served
    head = (
        "POST /v1/count HTTP/1.1\r\nhost: x\r\nauthorization: Bearer s3cret\r\n"
        f"content-type: application/json\r\ncontent-length: {MAX_BODY + 1}\r\n"
    )
    assert raw_request(rpc.url, head).startswith("HTTP/1.1 413")  # no byte of it was sent


def test_a_chunked_body_is_cut_off_at_the_limit(cluster1):
    wh = Warehouse.open(cluster1, tables=[IMAGES])
    rpc = Served(make_rpc_app(wh, max_body=1024))
    head = (
        "POST /v1/count HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        "transfer-encoding: chunked\r\n"
    )
    chunk = b"800\r\n" + b" " * 0x800 + b"\r\n"  # 2 KiB of a body that never ends
    try:
        assert raw_request(rpc.url, head, chunk).startswith("HTTP/1.1 413")
        assert RpcClient(rpc.url).count("images") == 0  # and the service carries on
    finally:
        rpc.close()
        wh.close()


def test_values_the_database_refuses_are_a_400_with_the_reason(served):
    wh, rpc, _ = served
    auth = {"authorization": "Bearer s3cret"}
    for path, payload in [
        ("/v1/scan", {"table": "images", "where": [["width", ">", "abc"]]}),
        ("/v1/count", {"table": "images", "where": [["width", "like", "1%"]]}),
        ("/v1/aggregate", {"table": "images", "aggs": {"s": ["sum", "src"]}}),
        ("/v1/get", {"table": "images", "keys": [{"not": "a key"}]}),
    ]:
        r = httpx.post(rpc.url + path, json=payload, headers=auth)
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert "the database refused" in r.json()["error"], r.json()
    r = httpx.post(
        rpc.url + "/v1/scan",
        json={"table": "images", "where": [["width", ">", "abc"]]},
        headers=auth,
    )
    assert 'invalid input syntax for type integer: "abc"' in r.json()["error"]
    with pytest.raises(UserError, match="the database refused"):
        wh.reader().scan("images", where=[("width", ">", "abc")])
    assert RpcClient(rpc.url, token="s3cret").count("images") == 0  # the pool is still fine
