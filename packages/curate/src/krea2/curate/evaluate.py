"""Filter precision and recall per defect class, from ground-truth labels and reject reasons."""

from __future__ import annotations

from collections.abc import Sequence

# Which reject reasons count as catching each defect class of the ShapesWorld injector.
DEFECT_REASONS: dict[str, frozenset[str]] = {
    "broken": frozenset({"broken"}),
    "truncated": frozenset({"truncated"}),
    "tiny": frozenset({"resolution"}),
    "extreme_aspect": frozenset({"aspect_ratio"}),
    "flat": frozenset({"flat_color", "entropy", "white_ratio", "black_ratio"}),
    "noise": frozenset({"noise", "laplacian", "complexity"}),
    "border": frozenset({"border"}),
    "exact_duplicate": frozenset({"exact_duplicate"}),
    "near_duplicate": frozenset({"near_duplicate"}),
    "text_dense": frozenset({"text_density", "text_legibility"}),
    "overrepresented": frozenset({"overrepresented"}),
    "semantic_duplicate": frozenset({"semantic_duplicate"}),
}


def precision_recall(
    labels: Sequence[str], reasons: Sequence[str | None]
) -> dict[str, dict[str, float]]:
    """Per defect class: ``precision`` (of the images rejected for the class's reasons, the
    share with that label), ``recall`` (of the images with that label, the share rejected for
    its reasons), ``support`` and ``flagged`` counts. ``reasons[i]`` is image i's reject reason
    (None if kept). Classes absent from ``labels`` are left out; precision is 1.0 when
    nothing was flagged."""
    out: dict[str, dict[str, float]] = {}
    for cls, accepted in DEFECT_REASONS.items():
        support = sum(label == cls for label in labels)
        if not support:
            continue
        flagged = [i for i, r in enumerate(reasons) if r in accepted]
        hits = sum(labels[i] == cls for i in flagged)
        caught = sum(lab == cls and r in accepted for lab, r in zip(labels, reasons, strict=True))
        out[cls] = {
            "precision": hits / len(flagged) if flagged else 1.0,
            "recall": caught / support,
            "support": float(support),
            "flagged": float(len(flagged)),
        }
    return out


def clean_kept(labels: Sequence[str], reasons: Sequence[str | None]) -> float:
    """Share of ``clean`` images that no filter rejected."""
    clean = [r for lab, r in zip(labels, reasons, strict=True) if lab == "clean"]
    return sum(r is None for r in clean) / len(clean) if clean else 1.0


def pair_precision_recall(
    predicted_groups: Sequence[Sequence[int]], true_groups: Sequence[Sequence[int]]
) -> dict[str, float]:
    """Pairwise precision/recall of duplicate groups (lists of item indices): a pair counts
    when both items share a group."""

    def pairs(groups: Sequence[Sequence[int]]) -> set[tuple[int, int]]:
        return {(a, b) for g in groups for a in g for b in g if a < b}

    pred, true = pairs(predicted_groups), pairs(true_groups)
    hit = len(pred & true)
    return {
        "precision": hit / len(pred) if pred else 1.0,
        "recall": hit / len(true) if true else 1.0,
        "predicted_pairs": float(len(pred)),
        "true_pairs": float(len(true)),
    }
