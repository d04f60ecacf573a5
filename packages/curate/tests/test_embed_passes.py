"""Pixel verification of copy candidates, the SAE artifact filter and balanced sampling."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

from krea2 import curate
from krea2.curate.cli import app
from krea2.curate.copy_verify import copy_score, thumbnail, top_candidates, verify_read
from krea2.curate.embed import ToyEncoder, ToyEncoderConfig, save_toy_encoder
from krea2.curate.kmeans import sample_paths
from krea2.curate.shapes import (
    SHAPES,
    Background,
    Scene,
    ShapeObject,
    make_pool,
    render,
    write_pool,
)
from krea2.curate.shapes.copies import copy_edit


def scene(shape: str, color: str, cell: int) -> Scene:
    return Scene((ShapeObject(shape, color, cell, "large"),), Background("solid", "dark gray"))


def test_crops_and_tone_edits_verify_and_a_different_shape_or_place_does_not():
    rng = np.random.default_rng(0)
    base = render(scene("circle", "blue", 0), 320, 320)
    src = thumbnail(base)
    for edit in ("crop", "tone", "degrade"):
        for _ in range(3):
            copy = copy_edit(base, edit, rng)
            assert copy_score(src, thumbnail(copy)) >= 0.95, edit
    others = (scene("square", "blue", 0), scene("circle", "blue", 1), scene("circle", "red", 0))
    for other in others:
        assert copy_score(src, thumbnail(render(other, 320, 320))) < 0.95, other


def test_a_crop_at_its_own_pixel_scale_is_found_through_the_original_size():
    base = render(scene("triangle", "green", 4), 400, 300)
    crop = base[20:260, 30:370]
    # Decoded smaller (as the warehouse's analysis pixels are), told the original size.
    small = base[::2, ::2]
    assert copy_score(thumbnail(small, original=(400, 300)), thumbnail(crop)) >= 0.95


def test_top_candidates_keeps_each_rows_most_similar_pairs():
    pairs = np.asarray([[0, 1], [0, 2], [0, 3], [1, 2], [2, 3]])
    sims = np.asarray([0.9, 0.8, 0.7, 0.95, 0.6], np.float32)
    # per row 1: 0-1 (0's best), 1-2 (1's and 2's best), 2-3 (3's... 0-3 is 3's best)
    assert top_candidates(pairs, sims, 1).tolist() == [0, 2, 3]
    assert top_candidates(pairs, sims, 9).tolist() == [0, 1, 2, 3, 4]
    ok, scores = verify_read(
        pairs, lambda i: (render(scene("circle", "blue", i % 2), 64, 64), None), 0.95
    )
    assert ok.tolist() == [False, True, False, False, False] and scores.shape == (5,)


def test_sample_paths_splits_the_budget_evenly_from_the_top():
    # Two top clusters: one of 90 rows in 3 leaves, one of 10 rows in 1 leaf.
    leaf = np.r_[np.zeros(30), np.ones(30), np.full(30, 2), np.full(10, 3)].astype(int)
    top = np.r_[np.zeros(90), np.ones(10)].astype(int)
    paths = np.stack([leaf, top], axis=1)
    got = sample_paths(paths, 40, seed=1)
    assert len(got) == 40 and len(set(got.tolist())) == 40
    counts = np.bincount(leaf[got], minlength=4)
    assert counts[3] == 10 and counts[:3].tolist() == [10, 10, 10]
    assert sample_paths(paths, 40, seed=1).tolist() == got.tolist()  # seeded


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, pg_server):
    import torch

    from krea2.krablet.testing import fresh_cluster_file

    tmp_path = tmp_path_factory.mktemp("embed-passes")
    cluster_file = fresh_cluster_file([pg_server], tmp_path / "cluster.json")
    pool = tmp_path / "pool"
    items = make_pool(
        seed=3, n_clean=16, n_per_defect=0, n_overrepresented=0, classes=(), n_copies=6,
        copy_edits=("crop", "tone"),
    )  # fmt: skip
    write_pool(items, pool)
    torch.manual_seed(0)
    model = tmp_path / "toy"
    # A random encoder: its vectors only propose candidates, the pixels decide.
    save_toy_encoder(ToyEncoder(ToyEncoderConfig(side=32, dim=16, threshold=0.5)), model)
    c = str(cluster_file)
    _invoke("ingest", str(pool), "--name", "pool", "--cluster", c)
    _invoke(
        "run", "--stages", "analyze,dedup,embed", "--embedder", f"toy:{model}",
        "--set", f"embed.store={tmp_path / 'store'}", "--cluster", c,
    )  # fmt: skip
    return c, items


COLS = ["uri", "sem_kind", "sem_dup_of", "sem_keep", "cluster", "sae_features", "sae_reject",
        "sample_keep", "embedding", "reject", "dup_kind"]  # fmt: skip


def _label_of(rows: list[dict], items) -> dict[str, object]:
    by_file = {f"{n:05d}-{it.key}.{it.ext}": it for n, it in enumerate(items)}
    return {r["image_key"]: by_file[r["uri"].rsplit("/", 1)[-1]] for r in rows}


def test_verified_semantic_dedup_drops_the_copies_and_only_them(warehouse):
    c, items = warehouse
    wh = curate.open_warehouse(c)
    # Every pair is a candidate (a random encoder's similarities say nothing): the pixels decide.
    everything = ["semantic.threshold=0.05", "semantic.candidates=50"]
    cfg = curate.load_curate_config(overrides=["semantic.verify=0.95", *everything])
    result = curate.run_stages(wh, ["semantic"], cfg)["semantic"]
    rows = [r for r in curate.read_rows(wh, COLS) if r["embedding"]]
    wh.close()
    item = _label_of(rows, items)
    assert result["candidates"] >= result["verified"] > 0
    copies = {k for k, it in item.items() if it.label == "semantic_duplicate"}
    dropped = {r["image_key"] for r in rows if r["sem_kind"]}
    assert copies and dropped == copies
    for r in rows:
        if r["sem_kind"]:
            assert item[r["sem_dup_of"]].key == item[r["image_key"]].source


def test_the_sae_and_balance_passes_are_deterministic_and_label_features(warehouse):
    c, _ = warehouse
    wh = curate.open_warehouse(c)
    # The copies' reason labels the features their images dominate (a stand-in for the
    # artifact reasons of OCR: the mechanism is the same).
    cfg = curate.load_curate_config(
        overrides=[
            "semantic.verify=0.95",
            "semantic.threshold=0.05",
            "semantic.candidates=50",
            "sae.artifact_reasons=semantic_duplicate",
            "sae.steps=50",
            "sae.features=16",
            "sae.k=2",
            "sae.min_images=1",
            "sae.top_images=2",
            "balance.share=0.5",
        ]
    )
    first = curate.run_stages(wh, ["semantic", "sae", "balance"], cfg)
    once = {r["image_key"]: r for r in curate.read_rows(wh, COLS)}
    again = curate.run_stages(wh, ["sae", "balance"], cfg)
    twice = {r["image_key"]: r for r in curate.read_rows(wh, COLS)}
    wh.close()
    assert once == twice and first["sae"] == {**again["sae"], "seconds": first["sae"]["seconds"]}
    sae = first["sae"]
    assert 0.0 <= sae["fvu"] < 1.0 and sae["l0"] == pytest.approx(2.0)
    embedded = [r for r in once.values() if r["embedding"]]
    assert all(r["sae_features"] for r in embedded)
    flagged = [r for r in embedded if r["sae_reject"]]
    assert sae["flagged"] == len(flagged) and set(sae["artifact_features"].values()) <= {
        "semantic_duplicate"
    }
    for r in flagged:  # flagged: its dominant feature is one the labelled rows dominate
        assert r["sae_features"].split(",")[0] in sae["artifact_features"]
    bal = first["balance"]
    kept = [r for r in embedded if not r["sem_kind"] and not r["sae_reject"]]
    assert bal["kept_before"] == len(kept) and bal["drawn"] == round(0.5 * len(kept))
    assert sum(bool(r["sample_keep"]) for r in embedded) == bal["drawn"]
    assert not any(r["sample_keep"] for r in embedded if r["sem_kind"] or r["sae_reject"])
    reasons = {curate.final_reason(r) for r in embedded if r["sample_keep"] is False}
    assert "unsampled" in reasons


def test_the_vlm_names_clusters_and_features_and_a_feature_can_be_dropped(warehouse):
    from krea2.curate.naming import name_clusters
    from krea2.curate.review import list_clusters
    from krea2.curate.shapes.caption_server import start_caption_server
    from krea2.curate.vlm import VlmClient

    c, _ = warehouse
    wh = curate.open_warehouse(c)
    curate.run_stages(
        wh, ["semantic"], curate.load_curate_config(overrides=["semantic.threshold=0.05"])
    )
    server, url = start_caption_server()
    bad, bad_url = start_caption_server(garbage=True)
    small = [f"sae.label_url={url}", "sae.steps=30", "sae.features=8", "sae.k=2",
             "sae.min_images=1", "sae.top_images=2"]  # fmt: skip
    try:
        result = name_clusters(wh, VlmClient(url), level=2, per_group=3)
        leaves = {r["cluster"]: r for r in list_clusters(wh) if r["level"] == 2}
        failed = name_clusters(wh, VlmClient(bad_url, retries=0), level=1)
        sae = curate.run_stages(wh, ["sae"], curate.load_curate_config(overrides=small))["sae"]
        first = next(iter(sae["feature_names"]))
        drop = curate.load_curate_config(overrides=[*small, f'sae.drop_features="{first}"'])
        dropped = curate.run_stages(wh, ["sae"], drop)["sae"]
        rows = curate.read_rows(wh, ["sae_features", "sae_reject", "embedding"])
    finally:
        server.shutdown()
        bad.shutdown()
        wh.close()
    assert result["clusters"] == result["named"] == len(leaves) and result["failed"] == 0
    # Each leaf is named after a colour+shape the toy VLM sees in its central images.
    assert all(r["name"] and r["name"].split()[-1] in SHAPES for r in leaves.values())
    assert failed["failed"] == failed["clusters"] > 0 and failed["named"] == 0
    names = sae["feature_names"].values()
    assert names and all(n.split()[-1] in SHAPES for n in names)
    hit = [r for r in rows if r["embedding"] and r["sae_features"].split(",")[0] == first]
    assert hit and all(r["sae_reject"] == "sae_artifact" for r in hit)
    assert dropped["flagged"] >= len(hit)


def test_name_clusters_from_the_cli_fills_the_review_queue_and_a_decision_clears_it(warehouse):
    from krea2.curate.review import list_clusters
    from krea2.curate.shapes.caption_server import start_caption_server

    c, _ = warehouse
    wh = curate.open_warehouse(c)
    curate.run_stages(
        wh, ["semantic"], curate.load_curate_config(overrides=["semantic.threshold=0.05"])
    )
    for r in list_clusters(wh, flagged_only=True):  # a clean queue: no earlier test's flags
        _clear_review(wh, r["cluster"])
    wh.close()
    server, url = start_caption_server()
    try:
        named = _invoke("name-clusters", "--url", url, "--level", "1", "--per-group", "8",
                        "--cluster", c)  # fmt: skip
    finally:
        server.shutdown()
    wh = curate.open_warehouse(c)
    top = [r for r in list_clusters(wh) if r["level"] == 1]
    wh.close()
    vlm_flagged = [r for r in top if (r["flag"] or "").startswith("vlm: ")]
    assert f"level 1: {len(top)} of {len(top)} clusters named" in named
    assert all(r["name"] for r in top)
    # The toy VLM flags a group whose most common colour+shape is under half its images.
    assert vlm_flagged and all(r["flag"] == "vlm: mixed content" for r in vlm_flagged)
    pending = _invoke("clusters", "--pending", "--cluster", c)
    assert pending.splitlines()[0] == f"{len(vlm_flagged)} pending clusters"
    first = vlm_flagged[0]["cluster"]
    assert any(line.split()[0] == first for line in pending.splitlines()[1:])
    _invoke("review", first, "--decision", "keep", "--cluster", c)
    after = _invoke("clusters", "--pending", "--cluster", c)
    assert after.splitlines()[0] == f"{len(vlm_flagged) - 1} pending clusters"
    assert all(line.split()[0] != first for line in after.splitlines()[1:])


def _clear_review(wh, cluster: str) -> None:
    """Clear a cluster's flag, name and decision (as a fresh semantic run leaves it)."""
    with wh.funnel() as f:
        f.patch("clusters", [{"cluster": cluster, "flag": "", "name": None, "decision": ""}])
        f.flush()


def test_nearest_by_image_embeds_the_query_as_the_embed_job_did(warehouse):
    from pathlib import Path

    c, _ = warehouse
    base = Path(c).parent  # the fixture's directory: pool/, toy/, store/
    wh = curate.open_warehouse(c)
    try:
        curate.run_stages(wh, ["vectors"], curate.load_curate_config())
        rows = [r for r in curate.read_rows(wh, ["uri", "embedding"]) if r["embedding"]]
    finally:
        wh.close()
    query = rows[0]["uri"].removeprefix("file://")
    out = _invoke("nearest", "--image", query, "--embedder", f"toy:{base / 'toy'}", "--k", "1",
                  "--cluster", c)  # fmt: skip
    sim, key = out.splitlines()[1].split()[:2]
    assert key == rows[0]["image_key"] and float(sim) > 0.999
