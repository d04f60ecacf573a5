"""The text-rendering reward: OCR of the image against the quoted words of the prompt."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from krea2.curate import OcrEngine
from krea2.rl.rewards.contract import RewardOutput, check_batch, empty_output

# "double", “curly” or 'single' quotes; a single quote must open after a space or start so
# that apostrophes ("don't") do not open a quote.
_QUOTED = re.compile(r"\"([^\"]+)\"|“([^”]+)”|(?:^|(?<=\s))'([^']+)'")
TEXT_SUB_SCORES: tuple[str, ...] = ("text_similarity", "text_exact")


def quoted_texts(prompt: str) -> list[str]:
    """The quoted phrases of ``prompt``, upper-cased with whitespace collapsed."""
    found = [next(g for g in m.groups() if g is not None) for m in _QUOTED.finditer(prompt)]
    return [t for t in (_normalize(f) for f in found) if t]


def _normalize(text: str) -> str:
    return " ".join(text.upper().split())


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions each cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def text_similarity(expected: str, read: Sequence[str]) -> float:
    """``1 - distance / max(len)`` of ``expected`` to the closest candidate among the OCR
    lines ``read``, their words, and all lines joined (0.0 when nothing was read)."""
    lines = [_normalize(r) for r in read if r.strip()]
    candidates = set(lines) | {w for line in lines for w in line.split()} | {" ".join(lines)}
    candidates.discard("")
    best = 0.0
    for c in candidates:
        best = max(best, 1.0 - edit_distance(expected, c) / max(len(expected), len(c)))
    return best


class TextRenderingReward:
    """Score = mean over the prompt's quoted phrases of :func:`text_similarity` with what
    OCR (rapidocr through ``krea2.curate.OcrEngine``) reads in the image, in [0, 1].

    Sub-scores: ``text_similarity`` (the same mean) and ``text_exact`` (share of phrases read
    exactly). A prompt without quoted text asks for no text: its sub-scores are NaN and its
    score is ``neutral`` (1.0 by default: nothing requested is missing; a constant per prompt
    also leaves group-normalized advantages unchanged). The OCR engine is created on first
    need (about 1–2 s) unless one is given.
    """

    name = "text"

    def __init__(self, ocr: OcrEngine | None = None, neutral: float = 1.0) -> None:
        self._ocr, self.neutral = ocr, float(neutral)
        self._lock = threading.Lock()

    def _engine(self) -> OcrEngine:
        with self._lock:
            if self._ocr is None:
                self._ocr = OcrEngine()
            return self._ocr

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        pixels, prompts = check_batch(images, prompts)
        if not prompts:
            return empty_output(TEXT_SUB_SCORES)
        n = len(prompts)
        scores = np.full(n, self.neutral, np.float32)
        similarity, exact = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
        for i, (image, prompt) in enumerate(zip(pixels, prompts, strict=True)):
            wanted = quoted_texts(prompt)
            if not wanted:
                continue
            read = [line.text for line in self._engine().read(image).lines]
            sims = [text_similarity(w, read) for w in wanted]
            similarity[i] = scores[i] = float(np.mean(sims))
            exact[i] = float(np.mean([s == 1.0 for s in sims]))
        return RewardOutput(scores, {"text_similarity": similarity, "text_exact": exact})
