"""Dynamic batching for the image server: requests of one shape sampled in one call.

Requests wait in arrival order. The oldest sets the next batch's shape (size, steps, CFG,
Turbo, negative prompt, style references); the batch closes when ``max_batch`` images of
that shape wait or the oldest has waited ``max_wait_ms``, and takes requests of that shape
in arrival order (a request's images are never split; one over ``max_batch`` is a batch of
its own). Requests of other shapes wait their turn: the next batch is the oldest's again.
One worker thread owns the model, so the event loop stays free for new requests, ``/health``
and ``/metrics`` while a batch samples. A request whose client went away before its batch
started is dropped (its future cancelled); one already sampling finishes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from krea2.dit.image_requests import ImageJob
from krea2.dit.served_model import ServedModel, Shape
from krea2.infra.metrics import gauge, histogram
from krea2.infra.pause import pause_point

__all__ = ["ImageBatcher", "Pending"]


@dataclass(eq=False)
class Pending:
    """A job waiting for its images: ``prompt`` (the expansion when there is one) and the
    future its handler awaits (uint8 images [n, H, W, 3])."""

    job: ImageJob
    prompt: str
    future: asyncio.Future
    queued_at: float = field(default_factory=time.monotonic)


class ImageBatcher:
    """Collects jobs into batches and samples them on one worker thread (module docstring).

    ``draining`` (set when the server is asked to stop) ends a pause point's hold, so a
    test's SIGTERM lands while a batch is provably under way."""

    def __init__(
        self,
        model: ServedModel,
        max_batch: int = 8,
        max_wait_ms: float = 10.0,
        draining: threading.Event | None = None,
    ) -> None:
        self.model, self.max_batch, self.max_wait_s = model, max_batch, max_wait_ms / 1000
        self.draining = draining or threading.Event()
        self.pending: deque[Pending] = deque()
        self.wake = asyncio.Event()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="dit-serve")
        self.batches = 0  # batches sampled: the count of the "image batches" pause point
        self.batch_images = histogram(
            "dit",
            "serve_batch_images",
            "Images per sampling call",
            buckets=(1, 2, 4, 8, 16, 32, 64),
        )
        self.queue_images = gauge("dit", "serve_queue_images", "Images waiting for a batch")

    def submit(self, job: ImageJob, prompt: str) -> Pending:
        """Queue ``job``; its ``future`` resolves to its images."""
        entry = Pending(job, prompt, asyncio.get_running_loop().create_future())
        self.pending.append(entry)
        self.queue_images.inc(job.n)
        self.wake.set()
        return entry

    def queued_images(self) -> int:
        return sum(p.job.n for p in self.pending if not p.future.done())

    async def run(self) -> None:
        """Batch and sample until cancelled."""
        while True:
            self._drop_cancelled()
            if not self.pending:
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = await self._gather(self.pending[0])
            if batch:
                await self._sample(batch)

    def _drop_cancelled(self) -> None:
        for entry in [p for p in self.pending if p.future.done()]:
            self.pending.remove(entry)
            self.queue_images.dec(entry.job.n)

    async def _gather(self, oldest: Pending) -> list[Pending]:
        """Wait for the oldest's shape to fill a batch or for its deadline; take the batch."""
        shape = oldest.job.shape
        deadline = oldest.queued_at + self.max_wait_s
        while (remaining := deadline - time.monotonic()) > 0:
            if self._images_of(shape) >= self.max_batch:
                break
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), remaining)
            except TimeoutError:
                break
        self._drop_cancelled()
        batch, images = [], 0
        for entry in list(self.pending):
            if entry.job.shape != shape:
                continue
            if batch and images + entry.job.n > self.max_batch:
                break
            batch.append(entry)
            images += entry.job.n
            self.pending.remove(entry)
            self.queue_images.dec(entry.job.n)
        return batch

    def _images_of(self, shape: Shape) -> int:
        return sum(p.job.n for p in self.pending if p.job.shape == shape and not p.future.done())

    async def _sample(self, batch: list[Pending]) -> None:
        self.batch_images.observe(sum(p.job.n for p in batch))
        loop = asyncio.get_running_loop()
        try:
            images = await loop.run_in_executor(self.executor, self._render, batch)
        except Exception as e:  # the model failed: every request of the batch learns why
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        start = 0
        for p in batch:
            if not p.future.done():
                p.future.set_result(images[start : start + p.job.n])
            start += p.job.n

    def _render(self, batch: list[Pending]) -> np.ndarray:
        """One sampling call, on the worker thread."""
        # A pause point (krea2.infra.pause) after ``batches`` batches: a test holds the
        # server here, this batch's requests received and unanswered, and stops it; the
        # server's SIGTERM ends the hold (``draining``) and the batch finishes.
        pause_point("image batches", self.batches, until=self.draining)
        first = batch[0].job
        prompts = [p.prompt for p in batch for _ in range(p.job.n)]
        seeds = [s for p in batch for s in p.job.seeds]
        try:
            return self.model.render(first.shape, prompts, seeds, first.refs, self.max_batch)
        finally:
            self.batches += 1

    def close(self) -> None:
        """Stop the worker thread; requests still queued are the caller's to answer."""
        self.executor.shutdown(wait=False, cancel_futures=True)
