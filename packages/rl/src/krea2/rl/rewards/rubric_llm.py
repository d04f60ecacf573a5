"""The rubric reward for real prompts: an LLM splits the prompt into requirements (cached per
prompt), a VLM checks each requirement on the image; both over an OpenAI-compatible API."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from krea2.rl.rewards.contract import RewardOutput, check_batch, empty_output
from krea2.rl.rewards.openai_client import OpenAICompatibleClient, image_part

SPLIT_INSTRUCTION = (
    "Split the image prompt into short requirements that can each be checked by looking at "
    "the image (objects, attributes, counts, positions, written text). Answer only with a "
    "JSON list of strings."
)
CHECK_INSTRUCTION = "Does the image satisfy this requirement? Answer yes or no.\nRequirement: "
RUBRIC_SUB_SCORES: tuple[str, ...] = ("requirements", "unclear")


def parse_requirements(answer: str) -> list[str]:
    """The requirement list of an LLM answer: a JSON list of strings (possibly inside other
    text or a code fence), else one requirement per non-empty line, bullets stripped."""
    start, end = answer.find("["), answer.rfind("]")
    if start != -1 and end > start:
        try:
            items = json.loads(answer[start : end + 1])
            if isinstance(items, list):
                return [str(x).strip() for x in items if str(x).strip()]
        except json.JSONDecodeError:
            pass
    lines = (line.strip().lstrip("-*•0123456789.) ").strip() for line in answer.splitlines())
    return [line for line in lines if line and not line.startswith("```")]


def parse_verdict(answer: str) -> float:
    """1.0 for yes, 0.0 for no, NaN when the answer says neither."""
    word = answer.strip().lstrip("*\"' ").lower()
    if word.startswith("yes"):
        return 1.0
    if word.startswith("no"):
        return 0.0
    return float("nan")


class RubricReward:
    """Score = share of the prompt's requirements the VLM says the image meets, in [0, 1]
    (an unclear answer counts as not met). Sub-scores: ``requirements`` (how many the LLM
    found) and ``unclear`` (share of answers neither yes nor no). A prompt the LLM splits
    into nothing scores 1.0 with NaN ``unclear``. Splits are cached per prompt (the LLM sees
    each prompt once); ``workers`` VLM questions are in flight at a time, so the server can
    batch them.
    """

    name = "rubric"

    def __init__(
        self,
        llm: OpenAICompatibleClient,
        vlm: OpenAICompatibleClient,
        *,
        cache_size: int = 100_000,
        workers: int = 8,
    ) -> None:
        self.llm, self.vlm, self.cache_size = llm, vlm, cache_size
        self._cache: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="rubric-vlm")
        self.llm_calls = 0

    def requirements(self, prompt: str) -> tuple[str, ...]:
        """The prompt's requirements (from the cache, or one LLM call)."""
        with self._lock:
            if prompt in self._cache:
                self._cache.move_to_end(prompt)
                return self._cache[prompt]
        messages = [
            {"role": "system", "content": SPLIT_INSTRUCTION},
            {"role": "user", "content": prompt},
        ]
        reqs = tuple(parse_requirements(self.llm.chat(messages)))
        with self._lock:
            self.llm_calls += 1
            self._cache[prompt] = reqs
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return reqs

    def _check(self, image: np.ndarray, requirement: str) -> float:
        content: list[dict[str, Any]] = [
            image_part(image),
            {"type": "text", "text": CHECK_INSTRUCTION + requirement},
        ]
        return parse_verdict(self.vlm.chat([{"role": "user", "content": content}], max_tokens=4))

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        pixels, prompts = check_batch(images, prompts)
        if not prompts:
            return empty_output(RUBRIC_SUB_SCORES)
        reqs = list(self._pool.map(self.requirements, dict.fromkeys(prompts)))
        by_prompt = dict(zip(dict.fromkeys(prompts), reqs, strict=True))
        questions = [(i, r) for i, p in enumerate(prompts) for r in by_prompt[p]]
        verdicts = list(self._pool.map(lambda q: self._check(pixels[q[0]], q[1]), questions))
        n = len(prompts)
        scores, count = np.ones(n, np.float32), np.zeros(n, np.float32)
        unclear = np.full(n, np.nan, np.float32)
        per_image: list[list[float]] = [[] for _ in range(n)]
        for (i, _), v in zip(questions, verdicts, strict=True):
            per_image[i].append(v)
        for i, vs in enumerate(per_image):
            if vs:
                arr = np.asarray(vs)
                count[i], scores[i] = len(vs), np.nansum(arr) / len(vs)
                unclear[i] = np.isnan(arr).mean()
        return RewardOutput(scores, {"requirements": count, "unclear": unclear})
