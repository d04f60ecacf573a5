"""Faithfulness of an expansion to the user's request: every requirement survives, none is
contradicted.

On ShapesWorld both texts are parsed by the rubric verifier's grammar
(`krea2.curate.shapes.parse_prompt`) and compared requirement by requirement; for real
prompts an LLM judge over an OpenAI-compatible server answers the same question as JSON.

>>> check_faithfulness("two red circles", "Two red circles on a navy background.").faithful
True
>>> check_faithfulness("a red circle in the top left", "A red circle on the right.").contradicted
('a red circle in the top left',)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from krea2.curate import VlmClient
from krea2.curate.shapes import Requirement, parse_prompt

__all__ = ["Faithfulness", "LlmFaithfulnessJudge", "check_faithfulness"]


@dataclass(frozen=True)
class Faithfulness:
    """``score``: the share of the request's requirements the expansion states without
    contradicting (1.0 for a request with none). ``missing`` / ``contradicted``: their
    descriptions."""

    score: float
    missing: tuple[str, ...]
    contradicted: tuple[str, ...]

    @property
    def faithful(self) -> bool:
        return not self.missing and not self.contradicted


def _contradiction(r: Requirement, said: list[Requirement]) -> bool:
    same_kind = [e for e in said if (e.color, e.shape) == (r.color, r.shape)]
    if r.kind == "position":
        cells = {e.cell for e in same_kind if e.kind == "position"}
        return bool(cells) and r.cell not in cells
    if r.kind == "count":
        counts = {e.count for e in same_kind if e.kind == "count"}
        positions = {e.cell for e in same_kind if e.kind == "position"}
        return bool(counts - {r.count}) or len(positions) > (r.count or 0)
    if r.kind == "total":
        return any(e.kind == "total" and e.count != r.count for e in said)
    if r.kind == "word":
        words = {e.word for e in said if e.kind == "word"}
        return bool(words) and r.word not in words
    return False


def _stated(r: Requirement, said: list[Requirement]) -> bool:
    if r in said:
        return True
    if r.kind == "object":  # a position or count of the kind states the object too
        return any((e.color, e.shape) == (r.color, r.shape) for e in said)
    return False


def check_faithfulness(request: str, expansion: str) -> Faithfulness:
    """Compare the requirements of ``request`` with those stated in ``expansion``."""
    wanted = parse_prompt(request)
    said = parse_prompt(expansion)
    missing, contradicted = [], []
    for r in wanted:
        if _contradiction(r, said):
            contradicted.append(r.describe())
        elif not _stated(r, said):
            missing.append(r.describe())
    ok = len(wanted) - len(missing) - len(contradicted)
    score = ok / len(wanted) if wanted else 1.0
    return Faithfulness(score, tuple(missing), tuple(contradicted))


JUDGE_PROMPT = (
    "You check whether an expanded image prompt stays faithful to a user's request. List "
    "every requirement of the request (subjects, attributes, counts, positions, text, style) "
    "that the expansion leaves out, and every one it contradicts. Answer with JSON only: "
    '{"requirements": <int>, "missing": [<str>...], "contradicted": [<str>...]}.'
)


def _parse_verdict(answer: str) -> Faithfulness:
    text = answer.strip().removeprefix("```json").removeprefix("```").removesuffix("```")
    try:
        verdict = json.loads(text)
        n = int(verdict["requirements"])
        missing = tuple(str(m) for m in verdict["missing"])
        contradicted = tuple(str(c) for c in verdict["contradicted"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"not a faithfulness verdict: {answer[:200]!r}") from exc
    if n < 0 or len(missing) + len(contradicted) > max(n, 0):
        raise ValueError(f"inconsistent verdict: {answer[:200]!r}")
    score = (n - len(missing) - len(contradicted)) / n if n else 1.0
    return Faithfulness(score, missing, contradicted)


class LlmFaithfulnessJudge:
    """Faithfulness of real prompts judged by an LLM behind an OpenAI-compatible server
    (vLLM in production): garbage answers are asked again, a dead server raises
    ``krea2.curate.VlmUnavailable`` naming it."""

    def __init__(self, client: VlmClient, garbage_retries: int = 2) -> None:
        self.client, self.garbage_retries = client, garbage_retries

    def __call__(self, requests: Sequence[str], expansions: Sequence[str]) -> list[Faithfulness]:
        if len(requests) != len(expansions):
            raise ValueError(f"{len(requests)} requests but {len(expansions)} expansions")
        messages = [
            [
                {"role": "system", "content": JUDGE_PROMPT},
                {"role": "user", "content": f"Request: {r}\n\nExpansion: {e}"},
            ]
            for r, e in zip(requests, expansions, strict=True)
        ]
        out = self.client.ask_many(messages, _parse_verdict, self.garbage_retries)
        for answer in out:
            if isinstance(answer, Exception):
                raise answer
        return out  # type: ignore[return-value]
