"""`krea2 dit serve`: a model folder behind an OpenAI Images-compatible HTTP API.

``POST /v1/images/generations`` takes the OpenAI fields and krea2's own
(:mod:`krea2.dit.image_requests`) and answers ``{"created", "data": [{"b64_json" | "url",
"seed", "revised_prompt"?}]}``; with ``response_format: "url"`` the PNGs are kept in a
bounded in-memory store and served from ``GET /v1/images/{id}.png``. With an expander URL
each prompt is expanded first (the expansion is what is sampled, returned as
``revised_prompt``); an expander that is down or slower than its timeout is a 502.
Concurrent requests of one shape are sampled together (:mod:`krea2.dit.image_batcher`).
``GET /health``, ``GET /metrics`` (Prometheus text) and ``GET /v1/models`` complete it.

Binds to loopback by default; off loopback a bearer token is required, and ``/v1/*`` checks
it before reading a body. Bodies are capped before they are read (413); every malformed
request is a 4xx whose OpenAI-style error names the field. On SIGTERM the server stops
accepting (new requests get 503, the socket closes), finishes every request it accepted
(their clients get their images), then exits.
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from krea2.dit.expander_client import ExpanderError, expand_prompt
from krea2.dit.image_batcher import ImageBatcher, Pending
from krea2.dit.image_requests import BadRequest, ImageJob, RequestLimits, parse_request
from krea2.dit.served_model import ServedModel
from krea2.infra.metrics import collecting_registry, counter, histogram
from krea2.infra.serving import BodyTooLarge, check_bind, read_body, token_matches

__all__ = ["TOKEN_ENV", "ImageServerConfig", "ImageServerThread", "create_app", "serve"]

TOKEN_ENV = "KREA2_DIT_TOKEN"


@dataclass(frozen=True)
class ImageServerConfig:
    """``max_batch`` images per sampling call, ``batch_wait_ms`` the longest the oldest
    request waits for others of its shape, ``default_size`` for requests without one,
    ``token`` the bearer token (None: no check), ``limits`` what one request may ask,
    ``max_queue_images`` waiting before new requests get 503, ``keep_images`` PNGs kept for
    ``response_format: "url"``; ``expander`` an OpenAI-compatible chat base URL
    (``.../v1``) that expands each prompt first, with its model name and timeout."""

    max_batch: int = 8
    batch_wait_ms: float = 10.0
    default_size: str = "1024x1024"
    token: str | None = None
    limits: RequestLimits = field(default_factory=RequestLimits)
    max_queue_images: int = 256
    keep_images: int = 256
    expander: str | None = None
    expander_model: str | None = None
    expander_timeout_s: float = 30.0


class ImageStore:
    """The last ``capacity`` PNGs by id (oldest evicted first), for URL responses."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, png: bytes) -> str:
        key = uuid.uuid4().hex
        with self._lock:
            self._items[key] = png
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return key

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._items.get(key)


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(status)
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    body = {"error": {"message": message, "type": kind, "param": param}}
    headers = {"connection": "close"} if status == 413 else None
    return JSONResponse(body, status_code=status, headers=headers)


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (its body was read: the next message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(
    model: ServedModel,
    config: ImageServerConfig | None = None,
    draining: threading.Event | None = None,
) -> FastAPI:
    """The FastAPI app serving ``model`` (module docstring). ``draining``: set when the
    server is asked to stop; new requests then get 503 and a held batch goes on."""
    config = config or ImageServerConfig()
    draining = draining or threading.Event()
    store = ImageStore(config.keep_images)
    state: dict[str, Any] = {}
    requests = counter("dit", "serve_requests_total", "Image requests by status", ["status"])
    made = counter("dit", "serve_images_total", "Images generated and returned")
    latency = histogram(
        "dit",
        "serve_request_seconds",
        "Image request latency (answered)",
        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # type: ignore[no-untyped-def]
        batcher = ImageBatcher(model, config.max_batch, config.batch_wait_ms, draining)
        task = asyncio.create_task(batcher.run())
        state["batcher"] = batcher
        yield
        task.cancel()
        # none queued after a graceful stop: uvicorn waited for them
        batcher.close(RuntimeError("the server is shutting down"))

    app = FastAPI(title=f"krea2 image server: {model.name}", lifespan=lifespan)

    def fail(status: int, message: str, param: str | None = None) -> JSONResponse:
        requests.labels(str(status)).inc()
        return _error(status, message, param)

    def refused(request: Request) -> JSONResponse | None:
        """401 unless the request carries the token (checked before its body is read)."""
        given = request.headers.get("authorization")
        if config.token is None or token_matches(given, config.token):
            return None
        return fail(401, "missing or wrong API key (Authorization: Bearer <token>)")

    @app.post("/v1/images/generations", response_model=None)
    async def generations(request: Request) -> dict | Response:
        started = time.perf_counter()
        if draining.is_set():
            return fail(503, "the server is shutting down; retry on another instance")
        if (denied := refused(request)) is not None:
            return denied
        try:
            raw = await read_body(request, config.limits.max_body_bytes)
            job = await run_in_threadpool(
                parse_request, raw, model, config.limits, config.default_size
            )
        except BodyTooLarge as e:  # the rest of the body is never read: close the connection
            return fail(413, f"{e}; send smaller or fewer style reference images")
        except BadRequest as e:
            return fail(e.status, str(e), e.param)
        batcher: ImageBatcher = state["batcher"]
        if batcher.queued() + job.n > config.max_queue_images:
            return fail(
                503,
                f"{batcher.queued()} images are queued (the server's cap "
                f"is {config.max_queue_images}); retry shortly",
            )
        prompt = job.prompt
        if config.expander is not None:
            try:
                prompt = await run_in_threadpool(
                    expand_prompt,
                    config.expander,
                    job.prompt,
                    config.expander_model,
                    timeout_s=config.expander_timeout_s,
                )
            except ExpanderError as e:
                return fail(502, f"the prompt expander failed: {e}")
        images = await _wait_for_images(request, batcher, job, prompt)
        if images is None:  # the client went away before its batch started
            requests.labels("499").inc()
            return Response(status_code=499)
        if isinstance(images, Exception):
            return fail(500, f"sampling failed: {type(images).__name__}: {images}")
        data = await run_in_threadpool(_encode, images, job, prompt, request)
        requests.labels("200").inc()
        made.inc(job.n)
        latency.observe(time.perf_counter() - started)
        return {"created": int(time.time()), "data": data}

    def _encode(
        images: np.ndarray, job: ImageJob, prompt: str, request: Request
    ) -> list[dict[str, Any]]:
        """The response's ``data``: each image as base64 PNG or as a URL into ``store``."""
        base = str(request.base_url).rstrip("/")
        data: list[dict[str, Any]] = []
        for image, seed in zip(images, job.seeds, strict=True):
            png = _png(image)
            item: dict[str, Any] = (
                {"url": f"{base}/v1/images/{store.put(png)}.png"}
                if job.response_format == "url"
                else {"b64_json": base64.b64encode(png).decode()}
            )
            item["seed"] = seed
            if config.expander is not None:
                item["revised_prompt"] = prompt
            data.append(item)
        return data

    @app.get("/v1/images/{name}", response_model=None)
    async def image(name: str, request: Request) -> Response:
        if (denied := refused(request)) is not None:
            return denied
        png = store.get(name.removesuffix(".png")) if name.endswith(".png") else None
        if png is None:
            return _error(
                404,
                f"no image {name}: unknown, or evicted (the server keeps the "
                f"last {config.keep_images})",
            )
        return Response(png, media_type="image/png")

    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> dict | Response:
        if (denied := refused(request)) is not None:
            return denied
        return {"object": "list", "data": [{"id": model.name, "object": "model"}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        batcher = state.get("batcher")
        return {
            "status": "draining" if draining.is_set() else "ok",
            "ready": batcher is not None and not draining.is_set(),
            "model": model.name,
            "size_multiple": model.size_multiple,
            "default_size": config.default_size,
            "style_references": model.style_slots,
            "expander": config.expander,
            "max_batch": config.max_batch,
            "batch_wait_ms": config.batch_wait_ms,
            "queued_images": batcher.queued() if batcher else 0,
            "batches": batcher.batches if batcher else 0,
            "limits": asdict(config.limits),
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(collecting_registry()), media_type=CONTENT_TYPE_LATEST)

    return app


async def _wait_for_images(
    request: Request, batcher: ImageBatcher, job: ImageJob, prompt: str
) -> np.ndarray | Exception | None:
    """Queue ``job`` and wait for its images; None when its client disconnected first (the
    job is then dropped unless its batch already started), the model's error if it failed."""
    future = batcher.submit(Pending(job, prompt))
    gone = asyncio.create_task(_client_gone(request))
    try:
        await asyncio.wait({future, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not future.done():
        future.cancel()
        return None
    return future.exception() or future.result()


class _DrainingServer(uvicorn.Server):
    """A uvicorn server that also sets ``draining`` when SIGTERM or SIGINT asks it to stop."""

    def __init__(self, config: uvicorn.Config, draining: threading.Event) -> None:
        super().__init__(config)
        self.draining = draining

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.draining.set()
        super().handle_exit(sig, frame)


def _server(model: ServedModel, host: str, port: int, config: ImageServerConfig) -> _DrainingServer:
    check_bind(host, config.token, "the image server", TOKEN_ENV)
    draining = threading.Event()
    app = create_app(model, config, draining)
    uv_config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    return _DrainingServer(uv_config, draining)


def serve(
    model: ServedModel,
    host: str = "127.0.0.1",
    port: int = 7460,
    config: ImageServerConfig | None = None,
) -> None:
    """Serve ``model`` until SIGTERM or Ctrl-C (blocking); accepted requests are answered
    before it returns."""
    _server(model, host, port, config or ImageServerConfig()).run()


class ImageServerThread:
    """The image server in a background thread (tests, benchmarks, notebooks)::

    with ImageServerThread(model) as server:
        httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "a red circle"})

    ``port=0`` picks a free port; ``close()`` stops it as SIGTERM does.
    """

    def __init__(
        self,
        model: ServedModel,
        host: str = "127.0.0.1",
        port: int = 0,
        config: ImageServerConfig | None = None,
    ) -> None:
        self._server = _server(model, host, port, config or ImageServerConfig())
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="dit-serve")
        self.draining = self._server.draining  # set: new requests get 503 (as after SIGTERM)
        self.host, self.port = host, port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ImageServerThread:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the image server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        self._server.draining.set()
        self._server.should_exit = True
        self._thread.join(timeout=60)

    def __enter__(self) -> ImageServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
