"""Embedding-level passes after semantic dedup: the SAE artifact filter and balanced sampling.

Both are recomputations over the warehouse, like the other passes: rows are read in one
fixed order (ingest ``seq``, then key) and every random draw is seeded, so a rerun, or a
run interrupted and resumed, writes the same verdicts.

**SAE artifact filter** (``sae_pass``): a top-k SAE (``krea2.curate.embed.sae``) is trained
on the embedded rows' vectors and each row is given its dominant feature. A feature is an
artifact feature when the rows it dominates are enriched in reject reasons listed in
``sae.artifact_reasons`` (the OCR stage's text rejects by default: what the cheap stages
already know to be an artifact): at least ``sae.min_images`` of them carry one, they are at
least ``sae.min_share`` of its rows, and so many would come from the pool's base rate with
probability at most ``sae.max_p`` (binomial tail). Every row it dominates then gets
``sae_reject = 'sae_artifact'``, so the filter carries what the cheap stages found on some
rows to the rows the SAE puts with them, with no classifier per artifact. The test is
against the base rate, not "half of the top images": the filter is worth running exactly
when the cheap stages catch only some of an artifact's rows, and then a pure artifact
feature's rows are mostly unlabelled. A VLM naming the features (``krea2.curate.vlm``) is
the other way to label them.

**Balanced sampling** (``balance_pass``): of the rows every earlier stage kept, a budget of
``balance.share`` of them is drawn evenly over the semantic pass's k-means hierarchy
(``krea2.curate.kmeans.sample_paths``: each cluster gets an equal share of its parent's
budget, small ones are kept whole); the rest get ``sample_keep = FALSE`` (reason
``unsampled``). ``share = 1`` keeps every row. Rows the coverage pass weighted above 1
(they carry a rare concept) are always drawn, and the pass reports the share of rare
concepts still present after sampling.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from krea2.curate.config import CurateConfig
from krea2.curate.stages import STAGES_BY_NAME, TABLE, reason_before, reject_columns
from krea2.curate.warehouse import scan_all
from krea2.krablet import Warehouse

SAE_REJECT = "sae_artifact"
UNSAMPLED = "unsampled"


def _ordered(rows: list[dict]) -> list[dict]:
    """Rows in ingest order (then key): one order for every run, whatever the shards return."""
    return sorted(rows, key=lambda r: (r.get("seq") or 0, r["image_key"]))


def sae_pass(wh: Warehouse, cfg: CurateConfig) -> dict[str, Any]:
    """Train the SAE on every embedded row, label its features from their top images and
    write ``sae_features`` (dominant features, most active first, comma-separated) and
    ``sae_reject``. Returns the SAE's stats (FVU, L0, dead features) and the artifact
    features with the reasons that labelled them."""
    from krea2.curate.embed.sae import SaeConfig, codes, tag, train_sae
    from krea2.curate.embed.store import read_vectors

    c = cfg.sae
    cols = ["image_key", "seq", "uri", "embedding", *reject_columns()]
    rows = _ordered(list(scan_all(wh, STAGES_BY_NAME["sae"].filters(), cols)))
    if len(rows) < 2:
        return {"rows": len(rows), "flagged": 0}
    keys = [r["image_key"] for r in rows]
    x = read_vectors([r["embedding"] for r in rows], keys).astype(np.float32)
    config = SaeConfig(features=c.features, k=c.k, steps=c.steps, batch=c.batch, seed=c.seed)
    sae, stats = train_sae(x, config)
    z = codes(sae, x)
    reasons = [reason_before(r, "sae") for r in rows]
    wanted = {s.strip() for s in c.artifact_reasons.split(",") if s.strip()}
    dominant = tag(z, top=3)
    artifact = artifact_features([d[0] if d else -1 for d in dominant], reasons, wanted, c)
    dropped = set(artifact) | {int(f) for f in c.drop_features.split(",") if f.strip()}
    patch = [
        {
            "image_key": k,
            "sae_features": ",".join(map(str, feats)),
            "sae_reject": SAE_REJECT if feats and feats[0] in dropped else "",
        }
        for k, feats in zip(keys, dominant, strict=True)
    ]
    names = _feature_names(rows, z, c) if c.label_url else {}
    with wh.funnel() as fn:
        fn.patch(TABLE, patch)
        fn.flush()
    return {
        "rows": len(rows),
        "flagged": sum(p["sae_reject"] != "" for p in patch),
        "artifact_features": {str(f): r for f, r in sorted(artifact.items())},
        **({"feature_names": names} if names else {}),
        **{k: round(float(v), 4) for k, v in stats.items() if k in SAE_STATS},
    }


def artifact_features(
    dominant: list[int], reasons: list[str | None], wanted: set[str], c: Any
) -> dict[int, str]:
    """``{feature: its most common reason}`` for the features whose dominated rows are
    enriched in ``wanted`` reasons (``dominant[i]``: row i's dominant feature, -1 = none):
    at least ``c.min_images`` such rows, at least ``c.min_share`` of the feature's rows,
    and a binomial tail at the pool's base rate of at most ``c.max_p``."""
    from scipy.stats import binom

    hit = np.asarray([r in wanted for r in reasons], bool)
    dom = np.asarray(dominant, np.int64)
    base = float(hit.mean()) if len(hit) else 0.0
    out: dict[int, str] = {}
    for f in np.unique(dom[dom >= 0]):
        mine = dom == f
        n, k = int(mine.sum()), int((mine & hit).sum())
        if k < c.min_images or k < c.min_share * n or binom.sf(k - 1, n, base) > c.max_p:
            continue
        labels = [reasons[i] for i in np.flatnonzero(mine & hit)]
        out[int(f)] = max(sorted(set(labels)), key=labels.count)
    return out


def _feature_names(rows: list[dict], z: np.ndarray, c: Any) -> dict[str, str]:
    """``{feature: name}`` from the VLM at ``c.label_url`` for every feature active on at
    least ``c.min_images`` rows, from its ``c.top_images`` most activating images (a
    feature whose request failed gets no name)."""
    from krea2.curate.decode import decode
    from krea2.curate.embed.sae import top_images
    from krea2.curate.naming import name_groups
    from krea2.curate.storage import read_uri
    from krea2.curate.vlm import VlmClient

    groups = {}
    for f in range(z.shape[1]):
        top = top_images(z, f, c.top_images)
        if len(top) >= c.min_images:
            groups[f] = [decode(read_uri(rows[i]["uri"])).pixels for i in top]
    client = VlmClient(c.label_url)
    try:
        named = name_groups(client, groups)
    finally:
        client.close()
    return {str(f): v[0] for f, v in named.items() if not isinstance(v, Exception)}


SAE_STATS = ("fvu", "l0", "dead_features", "dead_share", "max_frequency", "seconds")


def balance_pass(wh: Warehouse, cfg: CurateConfig) -> dict[str, Any]:
    """Draw ``balance.share`` of the rows every earlier stage kept, evenly over the k-means
    hierarchy of their ``cluster`` paths, and write ``sample_keep`` for every clustered row
    (FALSE: not drawn, or rejected earlier)."""
    from krea2.curate.kmeans import sample_paths

    c = cfg.balance
    cols = ["image_key", "seq", "cluster", "sample_weight", "concepts_found", *reject_columns()]
    rows = _ordered(list(scan_all(wh, STAGES_BY_NAME["balance"].filters(), cols)))
    kept = [r for r in rows if reason_before(r, "balance") is None]
    # Rows carrying a rare concept (coverage pass: weight > 1) are always kept; the rest of
    # the budget is drawn evenly over the hierarchy.
    drawn = {r["image_key"] for r in kept if (r.get("sample_weight") or 1.0) > 1.0}
    rest = [r for r in kept if r["image_key"] not in drawn]
    budget = round(c.share * len(kept)) - len(drawn)
    if rest and budget > 0:
        paths = np.asarray([[int(p) for p in r["cluster"].split("/")][::-1] for r in rest])
        drawn |= {rest[i]["image_key"] for i in sample_paths(paths, budget, c.seed)}
    patch = [{"image_key": r["image_key"], "sample_keep": r["image_key"] in drawn} for r in rows]
    with wh.funnel() as fn:
        fn.patch(TABLE, patch)
        fn.flush()
    leaves_before = len({r["cluster"] for r in kept})
    leaves_after = len({r["cluster"] for r in kept if r["image_key"] in drawn})
    out = {
        "rows": len(rows),
        "kept_before": len(kept),
        "drawn": len(drawn),
        "leaves_before": leaves_before,
        "leaves_after": leaves_after,
    }
    if any(r.get("concepts_found") for r in kept):  # the coverage pass ran
        from krea2.curate.coverage import coverage_shares

        after = [r for r in kept if r["image_key"] in drawn]
        out["coverage"] = coverage_shares(kept, after, cfg.coverage.rare_rows)
    return out
