"""The result every filter writes: a score, pass/fail against a threshold, and the reason."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FilterResult:
    """One filter's verdict on one image. ``reason`` is empty when it passes."""

    name: str
    score: float
    passed: bool
    reason: str = ""


def at_most(name: str, score: float, limit: float, what: str) -> FilterResult:
    """Pass when ``score <= limit``; the reason names the score and the limit."""
    if score <= limit:
        return FilterResult(name, float(score), True)
    return FilterResult(name, float(score), False, f"{what} {score:.4g} > {limit:.4g}")


def at_least(name: str, score: float, limit: float, what: str) -> FilterResult:
    """Pass when ``score >= limit``."""
    if score >= limit:
        return FilterResult(name, float(score), True)
    return FilterResult(name, float(score), False, f"{what} {score:.4g} < {limit:.4g}")
