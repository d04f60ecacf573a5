"""The embedder interface: images in, L2-normalised float16 vectors out, in batches.

Every image encoder of curate (SigLIP-2, DINOv3, SSCD, the toy encoder) is a
``TorchEmbedder``: a model function, a CPU preprocess that turns decoded images into the
model's input tensor, a device and a dtype. ``embed`` runs batches through the model while
a background thread prepares the next batch (decode and resize overlap the forward pass),
normalises in float32 and returns float16, the stored form (half the bytes, and a cosine
of two unit float16 vectors is within 1e-3 of the float32 one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch


class Embedder(Protocol):
    """Anything that embeds (h, w, 3) uint8 RGB images: ``name`` (what made the vectors),
    ``dim`` and ``threshold`` (cosine above which two images are copies, or None when the
    model does not say)."""

    name: str
    dim: int
    threshold: float | None

    def embed(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """(n, dim) float16, every row of unit L2 norm."""
        ...


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows of (n, d) scaled to unit L2 norm in float32 (a zero row stays zero)."""
    x = np.asarray(x, np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


Preprocess = Callable[[Sequence[np.ndarray]], "torch.Tensor | dict[str, torch.Tensor]"]


@dataclass
class TorchEmbedder:
    """A torch model behind the ``Embedder`` interface.

    ``forward(inputs) -> (b, dim)`` features (any float dtype; normalised here);
    ``preprocess(images) -> inputs``: a float tensor (b, 3, H, W) or a dict of tensors
    (a transformers processor's output), built on the CPU. ``device``/``dtype``: where and
    in what precision the model runs (floating inputs are moved and cast to them).
    ``batch_size``: images per forward pass.
    """

    name: str
    dim: int
    forward: Callable[[Any], torch.Tensor]
    preprocess: Preprocess
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 64
    threshold: float | None = None

    def _to_device(self, inputs: Any) -> Any:
        import torch

        dtype = getattr(torch, self.dtype)

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(self.device, dtype if t.is_floating_point() else None, non_blocking=True)

        if isinstance(inputs, dict) or hasattr(inputs, "items"):
            return {k: move(v) if hasattr(v, "to") else v for k, v in inputs.items()}
        return move(inputs)

    def _run(self, inputs: Any) -> np.ndarray:
        import torch

        with torch.inference_mode():
            feats = self.forward(self._to_device(inputs))
        feats = feats.float().cpu().numpy()
        if feats.ndim != 2 or feats.shape[1] != self.dim:
            raise ValueError(f"{self.name}: features {feats.shape}, expected (batch, {self.dim})")
        return l2_normalize(feats).astype(np.float16)

    def embed(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """(h, w, 3) uint8 images → (n, dim) float16 unit vectors."""
        batches = (images[i : i + self.batch_size] for i in range(0, len(images), self.batch_size))
        parts = list(self.embed_batches(batches))
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float16)

    def embed_batches(self, batches: Iterable[Sequence[np.ndarray]]) -> Iterator[np.ndarray]:
        """One (b, dim) float16 array per batch of images. While batch k runs through the
        model, a worker thread draws batch k+1 from ``batches`` (so a lazy iterator's
        reads and decodes overlap too) and preprocesses it."""
        it = iter(batches)

        def prepare() -> Any:
            batch = next(it, None)
            return None if batch is None else self.preprocess(batch)

        with ThreadPoolExecutor(1, thread_name_prefix="embed-prep") as pool:
            pending = pool.submit(prepare)
            while (inputs := pending.result()) is not None:
                pending = pool.submit(prepare)
                yield self._run(inputs)


def resize_batch(
    images: Sequence[np.ndarray],
    size: tuple[int, int],
    mean: Sequence[float] = (0.0, 0.0, 0.0),
    std: Sequence[float] = (1.0, 1.0, 1.0),
) -> torch.Tensor:
    """(h, w, 3) uint8 images → (b, 3, H, W) float32: squashed to ``size`` (H, W) with area
    interpolation, scaled to [0, 1], then ``(x − mean) / std`` per channel."""
    import cv2
    import torch

    h, w = size
    arr = np.stack(
        [cv2.resize(np.asarray(im), (w, h), interpolation=cv2.INTER_AREA) for im in images]
    ).astype(np.float32)
    arr = (arr / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()
