"""Caption-format sampling with configured weights, and caption dropout for CFG."""

from __future__ import annotations

import torch

from krea2.infra.shards import CAPTION_FORMATS


def choose_caption(
    captions: list[dict], weights: dict[str, float], dropout: float, generator: torch.Generator
) -> str:
    """One sample's training caption.

    With probability ``dropout`` the empty caption (the CFG negative); otherwise a format
    drawn with ``weights`` renormalised over the formats this sample has. A sample with
    none of the weighted formats uses its first caption; one with no caption gets "".
    Always draws two numbers, so the generator advances the same way for every sample.
    """
    u_drop, u_fmt = torch.rand(2, generator=generator, dtype=torch.float64).tolist()
    if u_drop < dropout or not captions:
        return ""
    by_format = {c["format"]: c["text"] for c in captions}
    options = [(f, weights[f]) for f in CAPTION_FORMATS if f in by_format and weights.get(f, 0) > 0]
    if not options:
        return captions[0]["text"]
    total = sum(w for _, w in options)
    acc = 0.0
    for fmt, w in options:
        acc += w / total
        if u_fmt < acc:
            return by_format[fmt]
    return by_format[options[-1][0]]


def choose_captions(
    batch: list[list[dict]],
    weights: dict[str, float],
    dropout: float,
    generators: list[torch.Generator],
) -> list[str]:
    """One caption per sample, sample i drawing from ``generators[i]``."""
    return [choose_caption(c, weights, dropout, g) for c, g in zip(batch, generators, strict=True)]
