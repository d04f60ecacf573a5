"""HTTP plumbing shared by the funnel and RPC services: JSON codec, auth, errors, serving."""

from __future__ import annotations

import base64
import hmac
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from krea2.infra.errors import UserError

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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise UserError(f"binding to {host} needs an auth token: pass --token or set KRABLET_TOKEN")


Handler = Callable[[dict[str, Any]], Any]


def json_app(routes: dict[str, Handler], token: str | None = None) -> Starlette:
    """A Starlette app of POST JSON endpoints: ``{"ok": result}`` or ``{"error": message}``.

    A bad token is 401, malformed JSON or a request naming unknown tables/columns is 400, a
    write the database refused is 422; messages never include DSNs or tracebacks.
    """

    def endpoint(fn: Handler):
        async def handle(request: Request) -> JSONResponse:
            if token is not None:
                given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
                if not hmac.compare_digest(given.encode(), token.encode()):
                    return JSONResponse({"error": "missing or wrong auth token"}, status_code=401)
            body = await request.body()
            if len(body) > MAX_BODY:
                return JSONResponse(
                    {"error": f"request larger than {MAX_BODY} bytes"}, status_code=413
                )
            try:
                payload = json.loads(body or b"{}")
                if not isinstance(payload, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as exc:
                return JSONResponse({"error": f"malformed JSON request: {exc}"}, status_code=400)
            try:
                result = await run_in_threadpool(fn, payload)  # handlers do blocking DB work
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
