"""Dynamic batching for the image server: requests of one shape sampled in one call.

The batching itself is :class:`krea2.infra.batching.MicroBatcher`: a batch holds requests
of one shape (size, steps, CFG, Turbo, negative prompt, style references), up to
``max_batch`` images (a request's images are never split; one over ``max_batch`` is a batch
of its own), and closes when they wait or the oldest has waited ``max_wait_ms``. Other
shapes wait their turn, oldest first. One worker thread owns the model, so the event loop
stays free for new requests, ``/health`` and ``/metrics`` while a batch samples. A request
whose client went away before its batch started is dropped (its future cancelled); one
already sampling finishes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from krea2.dit.image_requests import ImageJob
from krea2.dit.served_model import ServedModel
from krea2.infra.batching import MicroBatcher
from krea2.infra.metrics import gauge, histogram

__all__ = ["ImageBatcher", "Pending"]


@dataclass(frozen=True, eq=False)
class Pending:
    """A job waiting for its images, with ``prompt`` (the expansion when there is one)."""

    job: ImageJob
    prompt: str


class ImageBatcher(MicroBatcher[Pending, np.ndarray]):
    """Collects jobs into batches and samples them on one worker thread (module docstring);
    ``submit(Pending(job, prompt))`` gives a future of the job's uint8 images [n, H, W, 3].

    A pause point "image batches" (:mod:`krea2.infra.pause`) stands before each batch:
    a test holds the server there, the batch's requests received and unanswered, and stops
    it; ``draining`` (set when the server is asked to stop) ends the hold and the batch
    finishes."""

    def __init__(
        self,
        model: ServedModel,
        max_batch: int = 8,
        max_wait_ms: float = 10.0,
        draining: threading.Event | None = None,
    ) -> None:
        self.model = model
        batch_images = histogram(
            "dit",
            "serve_batch_images",
            "Images per sampling call",
            buckets=(1, 2, 4, 8, 16, 32, 64),
        )
        queue_images = gauge("dit", "serve_queue_images", "Images waiting for a batch")
        super().__init__(
            self._render,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            key=lambda p: p.job.shape,
            size=lambda p: p.job.n,
            pause="image batches",
            until=draining or threading.Event(),
            on_batch=batch_images.observe,
            on_queued=queue_images.inc,
            thread_name="dit-serve",
        )

    def _render(self, batch: list[Pending]) -> list[np.ndarray]:
        """One sampling call, on the worker thread: each job's images, in order."""
        first = batch[0].job
        prompts = [p.prompt for p in batch for _ in range(p.job.n)]
        seeds = [s for p in batch for s in p.job.seeds]
        images = self.model.render(first.shape, prompts, seeds, first.refs, self.max_batch)
        ends = np.cumsum([p.job.n for p in batch])
        return [images[end - p.job.n : end] for p, end in zip(batch, ends, strict=True)]
