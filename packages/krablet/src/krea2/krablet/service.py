"""The HTTP services: the funnel (writes) and RPC (reads) apps, their clients, and the JSON
codec, auth, errors and serving they share."""

from __future__ import annotations

import base64
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from krea2.infra.errors import UserError
from krea2.infra.serving import BodyTooLarge, read_body
from krea2.infra.serving import check_bind as check_server_bind
from krea2.krablet.connections import ShardsUnreachable
from krea2.krablet.funnel import Funnel, FunnelError
from krea2.krablet.reader import Reader
from krea2.krablet.schema import WarehouseView
from krea2.krablet.sql.reads import Filter

MAX_BODY = 64 * 2**20


def encode_value(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(v)).decode()}
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def decode_value(v: Any) -> Any:
    if isinstance(v, dict) and len(v) == 1 and "$bytes" in v:
        return base64.b64decode(v["$bytes"])
    return v


def encode_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: encode_value(v) for k, v in row.items()}


def decode_row(row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise UserError(f"each row must be a JSON object, got {type(row).__name__}")
    return {k: decode_value(v) for k, v in row.items()}


def check_bind(host: str, token: str | None) -> None:
    """Refuse to expose a krablet service beyond this machine without a token."""
    check_server_bind(host, token, "the krablet service", "KRABLET_TOKEN")


Handler = Callable[[dict[str, Any]], Any]


def json_app(
    routes: dict[str, Handler], token: str | None = None, max_body: int = MAX_BODY
) -> Starlette:
    """A Starlette app of POST JSON endpoints: ``{"ok": result}`` or ``{"error": message}``.

    A bad token is 401; malformed JSON, a request naming unknown tables/columns or holding
    values the database refuses (``"abc"`` for an integer column) is 400; a body over
    ``max_body`` bytes is 413, answered before it is read; a write the database refused is
    422; an unreachable shard is 503. Messages never include DSNs or tracebacks.
    """

    def endpoint(fn: Handler):
        async def handle(request: Request) -> JSONResponse:
            if token is not None:
                given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
                if not hmac.compare_digest(given.encode(), token.encode()):
                    return JSONResponse({"error": "missing or wrong auth token"}, status_code=401)
            try:
                body = await read_body(request, max_body)
            except BodyTooLarge:
                return JSONResponse(
                    {"error": f"request larger than {max_body} bytes"},
                    status_code=413,
                    headers={"connection": "close"},  # the rest of the body is never read
                )
            try:
                payload = json.loads(body or b"{}")
                if not isinstance(payload, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as exc:
                return JSONResponse({"error": f"malformed JSON request: {exc}"}, status_code=400)
            try:
                result = await run_in_threadpool(fn, payload)  # handlers do blocking DB work
            except ShardsUnreachable as exc:
                return JSONResponse({"error": str(exc)}, status_code=503)
            except UserError as exc:
                status = getattr(exc, "http_status", 400)
                return JSONResponse({"error": str(exc)}, status_code=status)
            except (KeyError, TypeError, ValueError) as exc:
                return JSONResponse(
                    {"error": f"bad request: {type(exc).__name__}: {exc}"}, status_code=400
                )
            return JSONResponse({"ok": result})

        return handle

    app = Starlette(
        routes=[Route(path, endpoint(fn), methods=["POST"]) for path, fn in routes.items()]
    )
    app.add_route("/healthz", lambda _r: JSONResponse({"ok": True}), methods=["GET"])
    return app


class Served:
    """A uvicorn server running in a background thread (tests, notebooks, benchmarks)."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.host, self.port = sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("service did not start")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class Client:
    """A small JSON-over-HTTP client; 4xx answers become :class:`UserError` (server's message)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def call(self, path: str, payload: dict[str, Any]) -> Any:
        resp = self._http.post(path, content=json.dumps(payload, default=encode_value))
        try:
            body = resp.json()
        except ValueError:
            body = {"error": resp.text[:500]}
        if resp.status_code >= 400:
            raise UserError(f"{path}: {resp.status_code}: {body.get('error', body)}")
        return body["ok"]

    def close(self) -> None:
        self._http.close()


def make_funnel_app(
    wh: WarehouseView,
    durable: bool = True,
    token: str | None = None,
    writers_per_shard: int = 8,
    max_body: int = MAX_BODY,
) -> Starlette:
    """The funnel as a service: POST /v1/upsert, /v1/patch ({table, rows}) and /v1/flush."""
    funnel = Funnel(wh, durable=durable, writers_per_shard=writers_per_shard)

    def rows_of(p: dict) -> list[dict]:
        rows = p["rows"]
        if not isinstance(rows, list):
            raise UserError("'rows' must be a list of objects")
        return [decode_row(r) for r in rows]

    def flush(p: dict) -> bool:
        try:
            funnel.flush(timeout=p.get("timeout"))
        except FunnelError as exc:
            exc.http_status = 422
            raise
        return True

    app = json_app(
        {
            "/v1/upsert": lambda p: funnel.upsert(p["table"], rows_of(p)),
            "/v1/patch": lambda p: funnel.patch(p["table"], rows_of(p)),
            "/v1/flush": flush,
        },
        token=token,
        max_body=max_body,
    )
    app.state.funnel = funnel
    return app


class FunnelClient:
    """The :class:`Funnel` API over HTTP: ``FunnelClient("http://127.0.0.1:7431", token=...)``."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 120.0) -> None:
        self._c = Client(url, token, timeout)

    def _send(self, op: str, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
        return int(
            self._c.call(f"/v1/{op}", {"table": table, "rows": [encode_row(dict(r)) for r in rows]})
        )

    def upsert(self, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
        return self._send("upsert", table, rows)

    def patch(self, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
        return self._send("patch", table, rows)

    def flush(self, timeout: float | None = None) -> None:
        self._c.call("/v1/flush", {"timeout": timeout})

    def close(self, flush: bool = True) -> None:
        try:
            if flush:
                self.flush()
        finally:
            self._c.close()

    def __enter__(self) -> FunnelClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(flush=exc_type is None)


def make_rpc_app(
    wh: WarehouseView, token: str | None = None, max_body: int = MAX_BODY
) -> Starlette:
    """Reads as a service: POST /v1/get, /v1/scan, /v1/count and /v1/aggregate."""
    reader = Reader(wh)

    def rows_out(rows: list[dict]) -> list[dict]:
        return [encode_row(r) for r in rows]

    def get(p: dict) -> Any:
        found = reader.get(p["table"], p["keys"], p.get("columns"))
        return rows_out(list(found.values()))

    def scan(p: dict) -> Any:
        rows, nxt = reader.scan(
            p["table"], p.get("where"), p.get("columns"), int(p.get("limit", 1000)), p.get("cursor")
        )
        return {"rows": rows_out(rows), "cursor": nxt}

    def count(p: dict) -> Any:
        return reader.count(p["table"], p.get("where"))

    def aggregate(p: dict) -> Any:
        return {
            k: float(v) if hasattr(v, "as_integer_ratio") and not isinstance(v, int) else v
            for k, v in reader.aggregate(p["table"], p["aggs"], p.get("where")).items()
        }

    return json_app(
        {"/v1/get": get, "/v1/scan": scan, "/v1/count": count, "/v1/aggregate": aggregate},
        token=token,
        max_body=max_body,
    )


class RpcClient:
    """The :class:`Reader` API over HTTP: ``RpcClient("http://127.0.0.1:7432", token=...)``."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0) -> None:
        self._c = Client(url, token, timeout)

    def get(self, table: str, keys: Sequence[Any], columns: Sequence[str] | None = None) -> dict:
        payload = {"table": table, "keys": list(keys), "columns": columns}
        rows = [decode_row(r) for r in self._c.call("/v1/get", payload)]
        return {next(iter(r.values())): r for r in rows}  # the key column comes first

    def scan(
        self,
        table: str,
        where: Sequence[Filter] | None = None,
        columns: Sequence[str] | None = None,
        limit: int = 1000,
        cursor: Any = None,
    ) -> tuple[list[dict], Any]:
        out = self._c.call(
            "/v1/scan",
            {"table": table, "where": where, "columns": columns, "limit": limit, "cursor": cursor},
        )
        return [decode_row(r) for r in out["rows"]], out["cursor"]

    def count(self, table: str, where: Sequence[Filter] | None = None) -> int:
        return int(self._c.call("/v1/count", {"table": table, "where": where}))

    def aggregate(
        self, table: str, aggs: dict[str, Sequence[str]], where: Sequence[Filter] | None = None
    ) -> dict[str, Any]:
        return self._c.call("/v1/aggregate", {"table": table, "aggs": aggs, "where": where})

    def close(self) -> None:
        self._c.close()
