"""Concept coverage: full-text search of concepts over the captions on every shard, rare
concepts found, sampling weights that oversample them, and coverage before and after.

The concepts are a list of names (one per line; a danker rank file ``name<TAB>score``
works as is, e.g. the vital-article titles ranked by ``krea2.curate.pagerank`` and cut at
the top share). Each shard gets a GIN index over ``to_tsvector('simple', captions)`` (the
captions' JSON strings; ``simple`` keeps words as written, no stemming) and answers one
query for all concepts: each concept is a ``phraseto_tsquery`` joined against the index,
so the work per shard grows with the matches, not with rows × concepts.

The ``coverage`` pass writes each captioned row's concepts (``concepts_found``) and a
``sample_weight``: a concept found in at most ``coverage.rare_rows`` of the rows every
earlier stage kept is rare, and a row carrying one weighs ``min(coverage.max_weight,
coverage.rare_rows / count)`` (1 otherwise). Balanced sampling keeps every row that weighs
more than 1, and the export repeats a row ``weight`` times (the fraction drawn with the
seed), so a rare concept is seen about ``rare_rows`` times per epoch. ``balance_pass``
reports the share of rare concepts present before and after sampling.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from krea2.curate.config import CurateConfig

INDEX = "images_captions_fts"


def read_concepts(path: str | Path) -> list[str]:
    """Concept names from a file: one per line, anything after a tab ignored (danker's
    ``name<TAB>score``), blank lines and duplicates dropped, order kept."""
    from krea2.infra.errors import UserError

    p = Path(path)
    if not p.is_file():
        raise UserError(f"coverage.concepts: no concept file at {p} (one concept per line)")
    names = [line.split("\t", 1)[0].strip() for line in p.read_text().splitlines()]
    return list(dict.fromkeys(n for n in names if n))


def ensure_caption_index(wh: Any) -> None:
    """Create the captions' GIN full-text index on every shard (idempotent)."""
    for i in range(len(wh.cluster)):
        with wh.cluster.connection(i) as conn:
            conn.execute(
                f"CREATE INDEX IF NOT EXISTS {INDEX} ON images "
                "USING GIN (to_tsvector('simple', coalesce(captions, '[]'::jsonb)))"
            )


def search_concepts(wh: Any, concepts: list[str]) -> dict[str, set[str]]:
    """``{image_key: concepts its captions mention}`` over every shard (a concept is
    matched as a phrase, case-insensitively)."""
    query = (
        "SELECT c.name, i.image_key FROM unnest(%s::text[]) AS c(name) "
        "JOIN images i ON to_tsvector('simple', coalesce(i.captions, '[]'::jsonb)) "
        "@@ phraseto_tsquery('simple', c.name)"
    )
    found: dict[str, set[str]] = {}
    for i in range(len(wh.cluster)):
        with wh.cluster.connection(i) as conn:
            for name, key in conn.execute(query, (concepts,)).fetchall():
                found.setdefault(key, set()).add(name)
    return found


def coverage_pass(wh: Any, cfg: CurateConfig) -> dict[str, Any]:
    """Write ``concepts_found`` and ``sample_weight`` for every captioned row."""
    from krea2.curate.stages import STAGES_BY_NAME, TABLE, reason_before, reject_columns
    from krea2.curate.warehouse import scan_all

    c = cfg.coverage
    concepts = read_concepts(c.concepts)
    ensure_caption_index(wh)
    found = search_concepts(wh, concepts)
    cols = ["image_key", *reject_columns()]
    rows = list(scan_all(wh, STAGES_BY_NAME["coverage"].filters(), cols))
    kept = [r for r in rows if reason_before(r, "coverage") is None]
    counts = Counter(name for r in kept for name in found.get(r["image_key"], ()))
    rare = {name for name, n in counts.items() if n <= c.rare_rows}
    patch = []
    for r in rows:
        names = sorted(found.get(r["image_key"], ()))
        weights = [c.rare_rows / counts[n] for n in names if n in rare]
        weight = min(c.max_weight, max(weights)) if weights else 1.0
        patch.append(
            {"image_key": r["image_key"], "concepts_found": names, "sample_weight": weight}
        )
    with wh.funnel() as f:
        f.patch(TABLE, patch)
        f.flush()
    return {
        "rows": len(rows),
        "concepts": len(concepts),
        "present": len(counts),
        "rare": len(rare),
        "weighted_rows": sum(p["sample_weight"] > 1 for p in patch),
    }


def coverage_shares(before: list[dict], after: list[dict], rare_rows: int) -> dict[str, Any]:
    """Concepts present among ``before`` rows (``concepts_found``), the rare ones (found in
    at most ``rare_rows`` of them), and the share of each still present ``after``."""
    counts = Counter(n for r in before for n in r.get("concepts_found") or ())
    rare = {n for n, k in counts.items() if k <= rare_rows}
    left = Counter(n for r in after for n in r.get("concepts_found") or ())
    return {
        "concepts_present": len(counts),
        "rare_concepts": len(rare),
        "concepts_present_after": len(left),
        "rare_present_after": sum(1 for n in rare if left[n]),
        "rare_share_after": (sum(1 for n in rare if left[n]) / len(rare)) if rare else 1.0,
    }


def repeats(weights: np.ndarray, seed: int) -> np.ndarray:
    """How many times the export writes each row of (n,) ``weights`` ≥ 0: the whole part,
    plus one with probability the fraction (seeded, so an export is reproducible)."""
    w = np.maximum(np.asarray(weights, np.float64), 0.0)
    frac = np.random.default_rng(seed).random(len(w)) < (w - np.floor(w))
    return (np.floor(w) + frac).astype(np.int64)
