"""A reward server: any :class:`Reward` behind HTTP (FastAPI + uvicorn) with dynamic batching.

Requests (see :mod:`krea2.rl.rewards.wire`) wait in a queue until ``max_batch`` images are
pending or the oldest has waited ``max_wait_ms``; same-size images are then scored in one
call of the reward, in one worker thread, and each request gets its rows back. A
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
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from krea2.infra.metrics import collecting_registry, counter, histogram
from krea2.infra.pause import pause_point
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


@dataclass
class _Job:
    pixels: np.ndarray
    prompts: list[str]
    future: asyncio.Future


class _Batcher:
    """Collects jobs into batches and scores them in one worker thread."""

    def __init__(self, reward: Reward, config: ServerConfig) -> None:
        self.reward, self.config = reward, config
        self.pending: deque[tuple[float, _Job]] = deque()
        self.wake = asyncio.Event()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="reward")
        self.calls = 0  # reward calls finished: the count of the "reward batches" pause point
        self.batch_images = histogram(
            "rl", "reward_batch_images", "Images per reward call", ["reward"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )  # fmt: skip

    def submit(self, pixels: np.ndarray, prompts: list[str]) -> asyncio.Future:
        job = _Job(pixels, prompts, asyncio.get_running_loop().create_future())
        self.pending.append((time.monotonic(), job))
        self.wake.set()
        return job.future

    def _queued_images(self) -> int:
        return sum(len(job.prompts) for _, job in self.pending)

    async def run(self) -> None:
        wait_s = self.config.max_wait_ms / 1000
        while True:
            await self.wake.wait()
            if not self.pending:
                self.wake.clear()
                continue
            deadline = self.pending[0][0] + wait_s
            while self._queued_images() < self.config.max_batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), remaining)
                except TimeoutError:
                    break
            jobs, images = [], 0
            while self.pending and (not jobs or images < self.config.max_batch):
                _, job = self.pending.popleft()
                jobs.append(job)
                images += len(job.prompts)
            if not self.pending:
                self.wake.clear()
            await self._score([j for j in jobs if not j.future.done()])

    async def _score(self, jobs: list[_Job]) -> None:
        groups: dict[tuple[int, int], list[_Job]] = {}
        for job in jobs:
            groups.setdefault(job.pixels.shape[1:3], []).append(job)
        loop = asyncio.get_running_loop()
        for group in groups.values():
            pixels = np.concatenate([j.pixels for j in group])
            prompts = [p for j in group for p in j.prompts]
            self.batch_images.labels(self.reward.name).observe(len(prompts))
            try:
                out = await loop.run_in_executor(self.executor, self._call, pixels, prompts)
            except Exception as e:  # the reward failed: every request of the batch learns why
                for j in group:
                    if not j.future.done():
                        j.future.set_exception(e)
                continue
            start = 0
            for j in group:
                rows = out.take(slice(start, start + len(j.prompts)))
                start += len(j.prompts)
                if not j.future.done():
                    j.future.set_result(rows)

    def _call(self, pixels: np.ndarray, prompts: list[str]) -> RewardOutput:
        """One reward call, on the worker thread."""
        # A pause point (krea2.infra.pause) after ``calls`` batches: a test holds the server
        # there, with this batch's requests received but unanswered, and kills it. On this
        # thread, so the event loop goes on accepting requests meanwhile.
        pause_point("reward batches", self.calls)
        try:
            return self.reward(pixels, prompts)
        finally:
            self.calls += 1


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
        batcher = _Batcher(reward, config)
        task = asyncio.create_task(batcher.run())
        state["batcher"] = batcher
        yield
        task.cancel()
        for _, job in batcher.pending:
            if not job.future.done():
                job.future.set_exception(HTTPException(503, "the reward server is shutting down"))
        batcher.executor.shutdown(wait=False, cancel_futures=True)

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
            future = state["batcher"].submit(pixels, prompts)
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
            "queued_images": batcher._queued_images() if batcher else 0,
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
