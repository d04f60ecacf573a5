"""Cluster review: a ``clusters`` table of the k-means hierarchy, flags, and human decisions.

The ``semantic`` pass records every cluster of the hierarchy (each prefix of a row's
``cluster`` path: ``2``, ``2/17``) with its size and level, and flags the leaves that look
like head concepts (more than ``FLAG_FACTOR`` × the median leaf size), so a person looks at
them first. Anyone may flag a cluster (``flag_cluster``; a VLM namer in production, a person
or a script here) and decide on it (``decide_cluster``: ``keep`` or ``drop``). The ``review``
pass turns decisions into the rows' ``cluster_reject`` (``cluster_review`` when the row sits
in a dropped cluster or below it), so a decision is one more reject reason and a rerun is
always safe. Size and level are rewritten by every semantic pass; flags, names, notes and
decisions are only ever written by people and namers (an upsert writes only its columns).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from krea2.curate.stages import CLUSTERS
from krea2.krablet import Warehouse

FLAG_FACTOR = 4.0
DECISIONS = ("keep", "drop", "")
REJECT = "cluster_review"


def cluster_sizes(paths: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Every prefix of the ``/``-separated ``paths`` → (level, rows at or below it)."""
    sizes: Counter[str] = Counter()
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts) + 1):
            sizes["/".join(parts[:i])] += 1
    return {c: (c.count("/") + 1, n) for c, n in sizes.items()}


def record_clusters(wh: Warehouse, paths: Sequence[str]) -> int:
    """Upsert every cluster of ``paths`` (one per row) with its level and size, and flag the
    oversized leaves (unless already flagged); returns how many leaves were flagged now."""
    sizes = cluster_sizes(paths)
    depth = max(level for level, _ in sizes.values())
    leaves = {c: n for c, (level, n) in sizes.items() if level == depth}
    median = float(np.median(list(leaves.values())))
    reader = wh.reader()
    flagged = {
        k for k, r in reader.get(CLUSTERS, list(leaves), columns=["flag"]).items() if r.get("flag")
    }
    new_flags = [
        {"cluster": c, "flag": f"oversized: {n} rows, {n / median:.1f}× the median leaf"}
        for c, n in leaves.items()
        if n > FLAG_FACTOR * median and c not in flagged
    ]
    with wh.funnel() as f:
        f.upsert(CLUSTERS, [{"cluster": c, "level": lv, "size": n} for c, (lv, n) in sizes.items()])
        f.flush()
        if new_flags:
            f.patch(CLUSTERS, new_flags)
            f.flush()
    return len(new_flags)


def flag_cluster(wh: Warehouse, cluster: str, flag: str, name: str | None = None) -> None:
    """Flag ``cluster`` for review with reason ``flag`` (and give it ``name``)."""
    _require(wh, cluster)
    row: dict[str, Any] = {"cluster": cluster, "flag": flag}
    if name is not None:
        row["name"] = name
    with wh.funnel() as f:
        f.patch(CLUSTERS, [row])
        f.flush()


def decide_cluster(wh: Warehouse, cluster: str, decision: str, note: str = "") -> None:
    """Record a reviewer's ``decision`` (keep / drop / '' to reopen) on ``cluster``."""
    from krea2.infra.errors import UserError

    if decision not in DECISIONS:
        raise UserError(f"decision {decision!r}: use one of keep, drop (or '' to reopen)")
    _require(wh, cluster)
    with wh.funnel() as f:
        f.patch(CLUSTERS, [{"cluster": cluster, "decision": decision, "note": note}])
        f.flush()


def list_clusters(wh: Warehouse, flagged_only: bool = False) -> list[dict]:
    """Clusters sorted by path, each with level, size, name, flag, decision and note."""
    from krea2.curate.warehouse import scan_table

    where = [["flag", "!=", ""]] if flagged_only else []
    rows = list(
        scan_table(wh, CLUSTERS, where, ["level", "size", "name", "flag", "decision", "note"])
    )
    return sorted(rows, key=lambda r: [int(p) for p in r["cluster"].split("/")])


def _require(wh: Warehouse, cluster: str) -> None:
    from krea2.infra.errors import UserError

    if not wh.reader().get(CLUSTERS, [cluster], columns=["size"]):
        raise UserError(
            f"no cluster {cluster!r}: run the semantic stage first, and give a "
            "path as listed by `krea2 curate clusters` (e.g. 2 or 2/17)"
        )


def review_pass(wh: Warehouse, cfg: Any = None) -> dict[str, int]:
    """Write every clustered row's ``cluster_reject``: ``cluster_review`` when it sits in a
    cluster (or below one) a reviewer dropped, '' otherwise."""
    from krea2.curate.stages import STAGES_BY_NAME, TABLE
    from krea2.curate.warehouse import scan_all

    dropped = {r["cluster"] for r in list_clusters(wh) if r.get("decision") == "drop"}
    rows = list(scan_all(wh, STAGES_BY_NAME["review"].filters(), ["image_key", "cluster"]))

    def in_dropped(path: str) -> bool:
        parts = path.split("/")
        return any("/".join(parts[:i]) in dropped for i in range(1, len(parts) + 1))

    patch = [
        {"image_key": r["image_key"], "cluster_reject": REJECT if in_dropped(r["cluster"]) else ""}
        for r in rows
    ]
    with wh.funnel() as f:
        f.patch(TABLE, patch)
        f.flush()
    return {"rows": len(rows), "dropped": sum(p["cluster_reject"] == REJECT for p in patch)}
