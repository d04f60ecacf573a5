"""The expander's rewards, served to trl's GRPOTrainer as reward functions.

Per batch of completions (G per request, consecutive, as trl groups them) the expansions
are rendered once by the DiT and scored:

- ``faithfulness``: every requirement of the user's request survives in the expansion
  (`krea2.expander.faithfulness`); prompt-level and verifiable;
- image-level rewards (`krea2.rl.rewards`), scored against the **user's request**, not the
  expansion: an expansion that drops what the user asked cannot win here;
- ``diversity``: mean pairwise cosine distance of an image embedding between each image and
  the other images of its request's group (always on: without it the expander collapses
  into one house style, report §8);
- the **gate** (`Gate`): a blocklist and an optional classifier over request + expansion; a
  gated completion never gets a positive advantage (`krea2.expander.gdpo`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from krea2.expander.faithfulness import check_faithfulness
from krea2.expander.sft_data import split_answer

__all__ = [
    "ExpanderRewards",
    "Gate",
    "StageRenderer",
    "completion_text",
    "pixel_embedding",
    "request_text",
]

Renderer = Callable[[list[str]], np.ndarray]  # prompts -> uint8 [N, H, W, 3]
Embedder = Callable[[np.ndarray], np.ndarray]  # uint8 [N, H, W, 3] -> [N, D]


def request_text(prompt: Any) -> str:
    """The user's request in a trl prompt (a message list: its last user turn; or text)."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m["role"] == "user"]
    if not users:
        raise ValueError("a prompt without a user turn has no request to expand")
    return str(users[-1])


def completion_text(completion: Any) -> str:
    """The expansion in a trl completion (messages or text), without the thinking block."""
    text = completion if isinstance(completion, str) else completion[-1]["content"]
    return split_answer(str(text))[1]


def pixel_embedding(images: np.ndarray, side: int = 16) -> np.ndarray:
    """A cheap image embedding: the image block-averaged to ``side``², centred and
    L2-normalised: [N, side² · 3] float32. The fallback when no encoder is given."""
    n, h, w, _ = images.shape
    fy, fx = max(1, h // side), max(1, w // side)
    crop = images[:, : fy * side, : fx * side].astype(np.float32) / 255.0
    small = crop.reshape(n, side, fy, side, fx, 3).mean(axis=(2, 4)).reshape(n, -1)
    small -= small.mean(axis=1, keepdims=True)
    return small / np.maximum(np.linalg.norm(small, axis=1, keepdims=True), 1e-8)


@dataclass(frozen=True)
class Gate:
    """Safety/constraint gate: a request or expansion containing a ``blocklist`` term (whole
    words, case-insensitive), or flagged by ``classifier`` (texts -> True where unsafe), is
    gated. ``__call__`` returns (mask [N] bool, reasons)."""

    blocklist: tuple[str, ...] = ()
    classifier: Callable[[list[str]], Sequence[bool]] | None = None

    def __call__(
        self, requests: Sequence[str], expansions: Sequence[str]
    ) -> tuple[np.ndarray, list[str]]:
        words = "|".join(re.escape(w) for w in self.blocklist)
        pattern = re.compile(rf"\b({words})\b", re.I) if words else None
        reasons = []
        for req, exp in zip(requests, expansions, strict=True):
            hit = pattern.search(f"{req}\n{exp}") if pattern else None
            reasons.append(f"blocklist: {hit.group(0)!r}" if hit else "")
        if self.classifier is not None:
            flags = list(
                self.classifier([f"{r}\n{e}" for r, e in zip(requests, expansions, strict=True)])
            )
            if len(flags) != len(reasons):
                raise ValueError(
                    f"gate classifier gave {len(flags)} flags for {len(reasons)} texts"
                )
            reasons = [
                r or ("classifier" if f else "") for r, f in zip(reasons, flags, strict=True)
            ]
        return np.array([bool(r) for r in reasons]), reasons


class StageRenderer:
    """Renders prompts with a trained stage of a krea2 run (the demo's DiT): one image per
    prompt, every prompt from the same seed so that images differ only by their prompts."""

    def __init__(
        self, job: Any, stage_index: int, steps: int = 8, cfg_scale: float = 1.0, seed: int = 0
    ) -> None:
        from krea2.trainer import load_stage_module

        self.job, self.stage_index = job, stage_index
        self.steps, self.cfg_scale, self.seed = steps, cfg_scale, seed
        self.module = load_stage_module(job, stage_index, True, None)

    def __call__(self, prompts: list[str]) -> np.ndarray:
        from krea2.trainer import sample_module

        grid = sample_module(
            self.job, self.stage_index, self.module, prompts, [self.seed], self.steps,
            self.cfg_scale,
        )  # fmt: skip
        return grid[:, 0]


class ExpanderRewards:
    """Scores each batch once and hands trl one reward function per score.

    ``image_rewards``: name -> a `krea2.rl.rewards.Reward` scored on the rendered expansion
    against the user's request. ``num_generations``: trl's G (groups are consecutive).
    After each batch ``last`` holds every score, the images and the gate's reasons."""

    def __init__(
        self,
        renderer: Renderer,
        image_rewards: dict[str, Any],
        num_generations: int,
        embedder: Embedder = pixel_embedding,
        gate: Gate | None = None,
    ) -> None:
        if num_generations < 2:
            raise ValueError("diversity and group advantages need num_generations >= 2")
        self.renderer, self.image_rewards = renderer, image_rewards
        self.num_generations, self.embedder = num_generations, embedder
        self.gate = gate or Gate()
        self._key: tuple | None = None
        self.last: dict[str, Any] = {}

    @property
    def names(self) -> list[str]:
        return ["faithfulness", *self.image_rewards, "diversity"]

    def score(self, prompts: Sequence[Any], completions: Sequence[Any]) -> dict[str, Any]:
        """Every score of a batch (cached: trl calls each reward function in turn)."""
        key = (tuple(map(str, prompts)), tuple(map(str, completions)))
        if key == self._key:
            return self.last
        requests = [request_text(p) for p in prompts]
        expansions = [completion_text(c) for c in completions]
        g = self.num_generations
        if len(requests) % g or any(
            len(set(requests[i : i + g])) != 1 for i in range(0, len(requests), g)
        ):
            raise ValueError(f"completions must come in consecutive groups of {g} per request")
        # An empty expansion renders as the request itself would: nothing to draw from.
        images = self.renderer([e or r for e, r in zip(expansions, requests, strict=True)])
        scores: dict[str, np.ndarray] = {
            "faithfulness": np.array(
                [check_faithfulness(r, e).score for r, e in zip(requests, expansions, strict=True)],
                dtype=np.float32,
            )
        }
        for name, reward in self.image_rewards.items():
            scores[name] = np.asarray(reward(images, requests).scores, dtype=np.float32)
        scores["diversity"] = group_diversity(self.embedder(images), g)
        gated, reasons = self.gate(requests, expansions)
        self._key = key
        self.last = {"scores": scores, "gated": gated, "reasons": reasons, "images": images,
                     "requests": requests, "expansions": expansions}  # fmt: skip
        return self.last

    def reward_funcs(self) -> list[Callable[..., list[float]]]:
        """One trl reward function per score, named after it (trl logs ``rewards/<name>``)."""

        def make(name: str) -> Callable[..., list[float]]:
            def reward(prompts, completions, **_: Any) -> list[float]:
                return [float(s) for s in self.score(prompts, completions)["scores"][name]]

            reward.__name__ = name
            return reward

        return [make(n) for n in self.names]


def group_diversity(embeddings: np.ndarray, group: int) -> np.ndarray:
    """Per image, the mean cosine distance (1 - cos) to the other images of its group of
    ``group`` consecutive rows: [N] float32 in [0, 2]."""
    e = np.asarray(embeddings, dtype=np.float32)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-8)
    out = np.zeros(len(e), dtype=np.float32)
    for start in range(0, len(e), group):
        block = e[start : start + group]
        dist = 1.0 - block @ block.T
        out[start : start + group] = dist.sum(axis=1) / max(len(block) - 1, 1)
    return out
