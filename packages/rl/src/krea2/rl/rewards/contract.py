"""The reward contract: images + prompts in, one score per image and named sub-scores out.

Every reward (in-process or behind a reward server) is a :class:`Reward`: it takes

* ``images``: uint8 ``[B, H, W, 3]`` RGB (numpy or torch), or float ``[B, 3, H, W]`` in
  ``[-1, 1]`` (numpy or torch; the autoencoders' convention), any ``B >= 0``;
* ``prompts``: ``B`` non-empty strings (the prompt each image was generated from);

and returns a :class:`RewardOutput` whose ``scores`` are ``[B]`` float32, higher is better,
and whose ``sub_scores`` map a name to ``[B]`` float32 (NaN where that sub-score does not
apply to an image). :func:`check_batch` is the one validation and conversion every reward
and the server run first, so a bad batch fails the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class RewardOutput:
    """``scores`` ``[B]`` float32 (higher is better); ``sub_scores`` name → ``[B]`` float32,
    NaN where a sub-score does not apply to an image."""

    scores: np.ndarray
    sub_scores: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        scores = np.asarray(self.scores, dtype=np.float32).reshape(-1)
        subs = {k: np.asarray(v, dtype=np.float32).reshape(-1) for k, v in self.sub_scores.items()}
        for name, values in subs.items():
            if values.shape != scores.shape:
                raise ValueError(
                    f"sub-score {name!r} has {values.shape[0]} values for {scores.shape[0]} images"
                )
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "sub_scores", subs)

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def take(self, index: slice | np.ndarray | Sequence[int]) -> RewardOutput:
        """The rows ``index`` (a slice or integer indices) of every array."""
        return RewardOutput(self.scores[index], {k: v[index] for k, v in self.sub_scores.items()})

    @staticmethod
    def concat(outputs: Sequence[RewardOutput]) -> RewardOutput:
        """Outputs one after another; a sub-score missing from a part is NaN on its rows."""
        names = sorted({k for o in outputs for k in o.sub_scores})
        if not outputs:
            return RewardOutput(np.zeros(0, np.float32))
        scores = np.concatenate([o.scores for o in outputs])
        subs = {
            k: np.concatenate(
                [o.sub_scores.get(k, np.full(len(o), np.nan, np.float32)) for o in outputs]
            )
            for k in names
        }
        return RewardOutput(scores, subs)


@runtime_checkable
class Reward(Protocol):
    """A reward model. ``name`` names it in composites, metrics and servers."""

    name: str

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput: ...


def _to_numpy(images: Any) -> np.ndarray:
    if type(images).__module__.split(".")[0] == "torch":
        return images.detach().cpu().numpy()
    return np.asarray(images)


def as_uint8_images(images: Any) -> np.ndarray:
    """uint8 ``[B, H, W, 3]`` RGB from uint8 ``[B, H, W, 3]`` or float ``[B, 3, H, W]`` in
    ``[-1, 1]`` (numpy or torch). Floats map as ``round((x + 1) * 127.5)``, clipped."""
    array = _to_numpy(images)
    if array.ndim != 4:
        raise ValueError(
            f"images must be a batch: uint8 [B, H, W, 3] or float [B, 3, H, W], got shape "
            f"{tuple(array.shape)}; add a batch axis for one image (images[None])"
        )
    if array.dtype == np.uint8:
        if array.shape[-1] != 3:
            raise ValueError(f"uint8 images must be [B, H, W, 3] RGB, got {tuple(array.shape)}")
        return np.ascontiguousarray(array)
    if np.issubdtype(array.dtype, np.floating):
        if array.shape[1] != 3:
            raise ValueError(
                f"float images must be [B, 3, H, W] in [-1, 1], got {tuple(array.shape)}"
            )
        pixels = np.rint((array.astype(np.float32).transpose(0, 2, 3, 1) + 1.0) * 127.5)
        return np.clip(np.nan_to_num(pixels, nan=0.0), 0, 255).astype(np.uint8)
    raise ValueError(
        f"images must be uint8 [B, H, W, 3] or float [B, 3, H, W], got dtype {array.dtype}"
    )


def check_batch(images: Any, prompts: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """``(uint8 [B, H, W, 3], prompts as a list)`` after checking the batch is well formed:
    one prompt per image, each a non-empty string. Raises ValueError naming the bad item."""
    pixels = as_uint8_images(images)
    if isinstance(prompts, str):
        raise ValueError("prompts must be a sequence of strings (one per image), not one string")
    prompts = list(prompts)
    if len(prompts) != pixels.shape[0]:
        raise ValueError(f"got {pixels.shape[0]} images but {len(prompts)} prompts; pass one each")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ValueError(f"prompt {i} is {type(p).__name__}, not a string")
        if not p.strip():
            raise ValueError(f"prompt {i} is empty; every image needs the prompt it was made for")
    return pixels, prompts


def empty_output(sub_score_names: Sequence[str] = ()) -> RewardOutput:
    """The output for ``B = 0``: empty scores and an empty array per sub-score name."""
    return RewardOutput(
        np.zeros(0, np.float32), {k: np.zeros(0, np.float32) for k in sub_score_names}
    )
