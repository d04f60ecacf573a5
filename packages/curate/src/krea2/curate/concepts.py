"""Over-represented concepts: cap each concept's share of the pool, dropping the surplus.

Concepts are per-image tags from any tagger (a classifier, SAE features, caption terms; for
ShapesWorld, the colour+shape pairs the verifier's analysis finds). A concept is
over-represented when it tags more than ``max_share`` of the pool; its images beyond that
share are dropped in a seeded, key-hashed order, so reruns drop the same images.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ConceptVerdict:
    """``share``: the largest pool share among the image's concepts; ``overrepresented``:
    it carries a concept above ``max_share``; ``keep``: it survives the cap."""

    share: float
    overrepresented: bool
    keep: bool


def _rank(seed: int, key: str) -> bytes:
    return hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()


def rebalance(
    keys: Sequence[str], tags: Sequence[frozenset[str]], max_share: float, seed: int = 0
) -> list[ConceptVerdict]:
    """One verdict per image. Each over-represented concept keeps ``⌊max_share · n⌋`` of its
    images (those ranked first by a seeded hash of the key); an image is dropped if any of
    its over-represented concepts does not keep it."""
    n = len(keys)
    counts = Counter(t for ts in tags for t in ts)
    cap = int(max_share * n)
    over = {t for t, c in counts.items() if c > cap}
    dropped: set[int] = set()
    for concept in over:
        members = sorted(
            (i for i, ts in enumerate(tags) if concept in ts), key=lambda i: _rank(seed, keys[i])
        )
        dropped.update(members[cap:])
    out = []
    for i, ts in enumerate(tags):
        share = max((counts[t] / n for t in ts), default=0.0)
        out.append(ConceptVerdict(share, bool(ts & over), i not in dropped))
    return out
