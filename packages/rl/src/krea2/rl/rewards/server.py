"""A reward server: any :class:`Reward` behind HTTP (FastAPI + uvicorn) with dynamic batching.

Requests (see :mod:`krea2.rl.rewards.wire`) wait in a queue until ``max_batch`` images of
the oldest's size are pending or it has waited ``max_wait_ms``; they are then scored in one
call of the reward (:class:`krea2.infra.batching.MicroBatcher`: at most ``max_batch``
images, unless one request holds more), in one worker thread, and each request gets its
rows back; other sizes take their turn, oldest first. A
``request_id`` seen before with the same body (a client's retry) is answered from the first
attempt's result instead of being scored again. Binds to loopback by default; a non-loopback
host needs a bearer token. A request's body is capped before it is read and its images
before they are decoded (:class:`~krea2.rl.rewards.wire.RequestLimits`); decoding runs off
the event loop, so a big request never stalls ``/health`` or the batcher.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import OrderedDict
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from krea2.infra.batching import MicroBatcher
from krea2.infra.metrics import collecting_registry, counter, histogram
from krea2.rl.rewards.contract import Reward, RewardOutput, check_batch
from krea2.rl.rewards.wire import (
    BINARY_TYPE,
    BadRequest,
    RequestLimits,
    TooLarge,
    decode_binary,
    decode_request,
    encode_output,
)
from krea2.rl.serving import BadJson, BodyTooLarge, check_bind, load_json, read_body, token_matches

TOKEN_ENV = "KREA2_REWARD_TOKEN"


@dataclass(frozen=True)
class ServerConfig:
    """``max_batch`` images per reward call, ``max_wait_ms`` the longest a request waits for
    others to join its batch, ``request_timeout_s`` until a request gets 504, ``token`` the
    bearer token (None: no check), ``remembered`` request ids kept for retries, ``limits``
    what one request may hold (413 beyond)."""

    max_batch: int = 32
    max_wait_ms: float = 5.0
    request_timeout_s: float = 60.0
    token: str | None = None
    remembered: int = 4096
    limits: RequestLimits = field(default_factory=RequestLimits)


@dataclass(frozen=True, eq=False)
class _Job:
    pixels: np.ndarray
    prompts: list[str]


def _image_shape(job: _Job) -> tuple[int, ...]:
    """Jobs of one image size share a reward call."""
    return job.pixels.shape[1:3]


def _score(reward: Reward, jobs: list[_Job]) -> list[RewardOutput]:
    """One reward call on same-size jobs, on the batcher's worker thread; each job's rows."""
    out = reward(np.concatenate([j.pixels for j in jobs]), [p for j in jobs for p in j.prompts])
    ends = np.cumsum([len(j.prompts) for j in jobs])
    return [out.take(slice(end - len(j.prompts), end)) for j, end in zip(jobs, ends, strict=True)]


def _batcher(reward: Reward, config: ServerConfig) -> MicroBatcher[_Job, RewardOutput]:
    """Jobs gathered into reward calls of one image size on one worker thread
    (:class:`~krea2.infra.batching.MicroBatcher`). A pause point "reward batches"
    (:mod:`krea2.infra.pause`) stands before each call: a test holds the server there, with
    the batch's requests received but unanswered, and kills it; the event loop goes on
    accepting requests meanwhile."""
    batch_images = histogram(
        "rl", "reward_batch_images", "Images per reward call", ["reward"],
        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    )  # fmt: skip
    return MicroBatcher(
        partial(_score, reward),
        max_batch=config.max_batch,
        max_wait_ms=config.max_wait_ms,
        key=_image_shape,
        size=lambda job: len(job.prompts),
        pause="reward batches",
        on_batch=batch_images.labels(reward.name).observe,
        thread_name="reward",
    )


def create_app(reward: Reward, config: ServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving ``reward``: POST ``/score``, GET ``/health`` and ``/metrics``."""
    config = config or ServerConfig()
    state: dict[str, Any] = {}
    # keyed by (request_id, body digest): a retry repeats both; another body under a
    # reused id is scored on its own instead of being answered with the first body's scores
    remembered: OrderedDict[tuple[str, bytes], asyncio.Future] = OrderedDict()
    requests = counter("rl", "reward_requests_total", "Score requests", ["reward", "status"])
    scored = counter("rl", "reward_images_total", "Images scored", ["reward"])
    retried = counter("rl", "reward_retries_total", "Requests answered from a retry", ["reward"])
    latency = histogram("rl", "reward_request_seconds", "Score request latency", ["reward"])

    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # type: ignore[no-untyped-def]
        batcher = _batcher(reward, config)
        task = asyncio.create_task(batcher.run())
        state["batcher"] = batcher
        yield
        task.cancel()
        batcher.close(HTTPException(503, "the reward server is shutting down"))

    app = FastAPI(title=f"krea2 reward server: {reward.name}", lifespan=lifespan)

    def fail(status: int, detail: str, headers: dict[str, str] | None = None) -> HTTPException:
        requests.labels(reward.name, str(status)).inc()
        return HTTPException(status, detail, headers)

    def decode(raw: bytes, binary: bool) -> tuple[str | None, Any, np.ndarray, list[str]]:
        """A request's (id, retry key, pixels, prompts); on a worker thread (base64, PNG
        decoding and hashing take milliseconds per megabyte)."""
        if binary:
            request_id, pixels, prompts = decode_binary(raw, config.limits)
        else:
            request_id, pixels, prompts = decode_request(load_json(raw), config.limits)
        pixels, prompts = check_batch(pixels, prompts)
        key = (request_id, hashlib.sha256(raw).digest()) if request_id else None
        return request_id, key, pixels, prompts

    @app.post("/score")
    async def score(request: Request) -> dict[str, Any]:
        started = time.perf_counter()
        if config.token is not None and not token_matches(
            request.headers.get("authorization"), config.token
        ):
            raise fail(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
        try:
            raw = await read_body(request, config.limits.max_body_bytes)
        except BodyTooLarge as e:  # the rest of the body is never read: close the connection
            detail = f"{e}; send fewer or smaller images per request"
            raise fail(413, detail, {"connection": "close"}) from None
        binary = request.headers.get("content-type", "").startswith(BINARY_TYPE)
        try:
            request_id, key, pixels, prompts = await run_in_threadpool(decode, raw, binary)
        except BadJson as e:
            raise fail(400, f"{e}; see krea2.rl.rewards.wire") from None
        except TooLarge as e:
            raise fail(413, str(e)) from None
        except (BadRequest, ValueError) as e:
            raise fail(422, str(e)) from None
        future = remembered.get(key) if key else None
        if future is not None:
            retried.labels(reward.name).inc()
        else:
            future = state["batcher"].submit(_Job(pixels, prompts))
            if key:
                remembered[key] = future
                while len(remembered) > config.remembered:
                    remembered.popitem(last=False)
        try:
            out: RewardOutput = await asyncio.wait_for(
                asyncio.shield(future), config.request_timeout_s
            )
        except TimeoutError:
            raise fail(504, f"not scored within {config.request_timeout_s} s; retry") from None
        except HTTPException as e:
            raise fail(e.status_code, str(e.detail)) from None
        except Exception as e:
            if key:
                remembered.pop(key, None)  # let a retry score it again
            raise fail(500, f"the reward failed: {type(e).__name__}: {e}") from None
        requests.labels(reward.name, "200").inc()
        scored.labels(reward.name).inc(len(out))
        latency.labels(reward.name).observe(time.perf_counter() - started)
        return {"request_id": request_id, "reward": reward.name, **encode_output(out)}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        batcher = state.get("batcher")
        return {
            "status": "ok",
            "reward": reward.name,
            "max_batch": config.max_batch,
            "max_wait_ms": config.max_wait_ms,
            "queued_images": batcher.queued() if batcher else 0,
            "limits": asdict(config.limits),
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(collecting_registry()), media_type=CONTENT_TYPE_LATEST)

    return app


def serve(
    reward: Reward, host: str = "127.0.0.1", port: int = 7440, config: ServerConfig | None = None
) -> None:
    """Serve ``reward`` until interrupted (blocking)."""
    config = config or ServerConfig()
    check_bind(host, config.token, "the reward server", TOKEN_ENV)
    uvicorn.run(create_app(reward, config), host=host, port=port, log_level="warning")


class ServerThread:
    """A reward server in a background thread (tests, benchmarks, notebooks)::

    with ServerThread(reward) as server:
        RewardClient(server.url)(images, prompts)

    ``port=0`` picks a free port.
    """

    def __init__(
        self,
        reward: Reward,
        host: str = "127.0.0.1",
        port: int = 0,
        config: ServerConfig | None = None,
    ) -> None:
        self.config = config or ServerConfig()
        check_bind(host, self.config.token, "the reward server", TOKEN_ENV)
        uv_config = uvicorn.Config(
            create_app(reward, self.config), host=host, port=port, log_level="warning"
        )
        self._server = uvicorn.Server(uv_config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="reward-server")
        self.host, self.port = host, port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the reward server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
