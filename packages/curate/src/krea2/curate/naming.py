"""Names for groups of images from a VLM: k-means clusters (from the images nearest each
centroid) and SAE features (from their most activating images).

One request per group: up to ``per_group`` images and the question below, answered as
JSON ``{"name": "...", "flag": "..."}``; ``flag`` is the VLM's reason for a person to look
(mixed content, an artifact, something unsafe), "" when nothing. Through ``VlmClient``, so
retries, rate limits, concurrency and garbage re-asks apply, and a group whose request
fails keeps no name (its error is counted, the others land).

``name_clusters`` writes names into the ``clusters`` review table and flags where the VLM
gives a reason (``krea2 curate clusters --flagged`` lists them); an existing human flag is
never overwritten.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from krea2.curate.vlm import Messages, VlmClient, image_part

NAME_PROMPT = (
    "These images were grouped together. Name what they have in common in a few words, "
    'and flag the group if a person should look at it. Answer as JSON: {"name": "...", '
    '"flag": "" or the reason}.'
)


def naming_request(images: Sequence[np.ndarray]) -> Messages:
    content = [image_part(p) for p in images] + [{"type": "text", "text": NAME_PROMPT}]
    return [{"role": "user", "content": content}]


def parse_name(answer: str) -> tuple[str, str]:
    """(name, flag) from the VLM's JSON; anything else is a ``ValueError`` (asked again)."""
    match = re.search(r"\{.*\}", answer, re.S)
    try:
        data = json.loads(match.group(0) if match else answer)
    except json.JSONDecodeError:
        raise ValueError(f"not JSON: {answer[:120]!r}") from None
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"no name in {answer[:120]!r}")
    flag = data.get("flag") or ""
    return name.strip(), str(flag).strip()


def name_groups(
    client: VlmClient, groups: dict[Any, Sequence[np.ndarray]], garbage_retries: int = 2
) -> dict[Any, tuple[str, str] | Exception]:
    """``{group: (name, flag)}`` or the group's exception, one request per group."""
    keys = list(groups)
    requests = [naming_request(groups[k]) for k in keys]
    answers = client.ask_many(requests, parse_name, garbage_retries)
    return dict(zip(keys, answers, strict=True))


def nearest_members(x: np.ndarray, paths: Sequence[str], level: int, per_group: int) -> dict:
    """``{cluster path at level (1 = top): row indices of the per_group rows nearest its
    centroid}`` for unit vectors ``x`` (n, d) and each row's ``cluster`` path."""
    prefix = ["/".join(p.split("/")[:level]) for p in paths]
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(prefix):
        groups.setdefault(c, []).append(i)
    out = {}
    for c, members in groups.items():
        xs = np.asarray(x[members], np.float32)
        centroid = xs.mean(0)
        order = np.argsort(-(xs @ centroid), kind="stable")[:per_group]
        out[c] = [members[j] for j in order]
    return out


def name_clusters(wh: Any, client: VlmClient, level: int = 1, per_group: int = 4) -> dict[str, int]:
    """Name every cluster at ``level`` from the images nearest its centroid; write names
    (and the VLM's flags, where a cluster has none yet) into the ``clusters`` table."""
    from krea2.curate.decode import decode
    from krea2.curate.embed.store import read_vectors
    from krea2.curate.stages import CLUSTERS, STAGES_BY_NAME
    from krea2.curate.storage import read_uri
    from krea2.curate.warehouse import scan_all

    cols = ["image_key", "seq", "uri", "embedding", "cluster"]
    rows = [r for r in scan_all(wh, STAGES_BY_NAME["review"].filters(), cols) if r["embedding"]]
    rows.sort(key=lambda r: (r["seq"] or 0, r["image_key"]))
    if not rows:
        return {"clusters": 0, "named": 0, "flagged": 0, "failed": 0}
    x = read_vectors([r["embedding"] for r in rows], [r["image_key"] for r in rows])
    picks = nearest_members(x, [r["cluster"] for r in rows], level, per_group)
    groups = {c: [decode(read_uri(rows[i]["uri"])).pixels for i in ix] for c, ix in picks.items()}
    named = name_groups(client, groups)
    flagged = {
        k for k, r in wh.reader().get(CLUSTERS, list(named), columns=["flag"]).items() if r["flag"]
    }
    patch = []
    for c, got in named.items():
        if isinstance(got, Exception):
            continue
        name, flag = got
        row = {"cluster": c, "name": name}
        if flag and c not in flagged:
            row["flag"] = f"vlm: {flag}"
        patch.append(row)
    with wh.funnel() as f:
        f.patch(CLUSTERS, patch)
        f.flush()
    return {
        "clusters": len(named),
        "named": len(patch),
        "flagged": sum("flag" in p for p in patch),
        "failed": sum(isinstance(v, Exception) for v in named.values()),
    }
