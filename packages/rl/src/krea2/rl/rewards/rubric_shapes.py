"""The ShapesWorld rubric reward: ``krea2.curate.shapes``' verifier as a reward."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from krea2.curate import OcrEngine, shapes
from krea2.rl.rewards.contract import RewardOutput, check_batch, empty_output

REQUIREMENT_KINDS: tuple[str, ...] = ("object", "position", "count", "total", "word")


class ShapesRubricReward:
    """Score = share of the prompt's requirements the image meets (the verifier's score);
    sub-scores: the pass rate per requirement kind (:data:`REQUIREMENT_KINDS`), NaN for a
    kind the prompt does not ask for. A prompt with no verifiable requirement scores 1.0.

    Word requirements are read with an OCR engine, created on first need (about 1–2 s) unless
    one is given; ``ocr=False`` leaves words unread, so they fail (never silently pass).
    """

    name = "rubric-shapes"

    def __init__(self, ocr: OcrEngine | bool = True) -> None:
        self._ocr: OcrEngine | None = ocr if isinstance(ocr, OcrEngine) else None
        self._want_ocr = ocr is not False
        self._lock = threading.Lock()

    def _engine(self, prompt: str) -> OcrEngine | None:
        if not self._want_ocr or not any(r.kind == "word" for r in shapes.parse_prompt(prompt)):
            return None
        with self._lock:
            if self._ocr is None:
                self._ocr = OcrEngine()
            return self._ocr

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        pixels, prompts = check_batch(images, prompts)
        if not prompts:
            return empty_output(REQUIREMENT_KINDS)
        scores = np.zeros(len(prompts), np.float32)
        subs = {k: np.full(len(prompts), np.nan, np.float32) for k in REQUIREMENT_KINDS}
        for i, (image, prompt) in enumerate(zip(pixels, prompts, strict=True)):
            verdict = shapes.verify(prompt, image, ocr=self._engine(prompt))
            scores[i] = verdict.score
            for kind, rate in verdict.by_kind().items():
                subs[kind][i] = rate
        return RewardOutput(scores, subs)
