"""The embed job and the semantic pass on a real krablet warehouse."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

from krea2 import curate
from krea2.curate.cli import app
from krea2.curate.decode import decode
from krea2.curate.embed import (
    ToyEncoder,
    ToyEncoderConfig,
    load_embedder,
    save_toy_encoder,
)
from krea2.curate.embed.store import read_vectors
from krea2.curate.shapes import make_pool, write_pool
from krea2.curate.storage import read_uri
from krea2.infra.errors import UserError

COLS = [
    "dup_keep",
    "embedding",
    "embed_model",
    "sem_keep",
    "sem_kind",
    "sem_dup_of",
    "sem_similarity",
    "cluster",
    "width",
    "height",
    "seq",
    "uri",
]


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, pg_server):
    import torch

    from krea2.krablet.testing import fresh_cluster_file

    tmp_path = tmp_path_factory.mktemp("embed-jobs")
    cluster_file = fresh_cluster_file([pg_server], tmp_path / "cluster.json")
    pool = tmp_path / "pool"
    write_pool(
        make_pool(
            seed=5,
            n_clean=14,
            n_per_defect=2,
            n_overrepresented=0,
            classes=("near_duplicate",),
            n_copies=4,
        ),
        pool,
    )
    torch.manual_seed(0)
    model = tmp_path / "toy"
    save_toy_encoder(ToyEncoder(ToyEncoderConfig(side=32, dim=16, threshold=0.97)), model)
    c = str(cluster_file)
    store = tmp_path / "store"
    _invoke("ingest", str(pool), "--name", "pool", "--cluster", c)
    out = _invoke(
        "run",
        "--stages",
        "analyze,dedup,embed,semantic",
        "--embedder",
        f"toy:{model}",
        "--set",
        f"embed.store={store}",
        "--batch-size",
        "8",
        "--cluster",
        c,
    )
    return c, model, store, out


def test_every_hash_keeper_gets_its_own_vector_in_the_store(embedded):
    c, model, store, out = embedded
    assert "semantic: {'rows':" in out
    wh = curate.open_warehouse(c)
    rows = curate.read_rows(wh, COLS)
    wh.close()
    keepers = [r for r in rows if r["dup_keep"]]
    assert keepers and all(r["embedding"] for r in keepers)
    assert not any(r["embedding"] for r in rows if not r["dup_keep"])
    assert {r["embed_model"] for r in keepers} == {f"toy:{model}"}
    assert all(r["embedding"].startswith(str(store.resolve())) for r in keepers)
    stored = read_vectors([r["embedding"] for r in keepers], [r["image_key"] for r in keepers])
    pixels = [decode(read_uri(r["uri"])).pixels for r in keepers[:5]]
    direct = load_embedder(f"toy:{model}").embed(pixels)
    np.testing.assert_allclose(stored[:5].astype(np.float32), direct.astype(np.float32), atol=2e-3)


def test_the_semantic_verdicts_follow_the_keep_rule(embedded):
    c, *_ = embedded
    wh = curate.open_warehouse(c)
    x = read_vectors([r["embedding"] for r in curate.read_rows(wh, COLS) if r["embedding"]])
    sims = x.astype(np.float32) @ x.astype(np.float32).T
    # A random encoder finds no copy at its own threshold: set one that 5% of pairs pass.
    threshold = float(np.quantile(sims[np.triu_indices(len(x), 1)], 0.95))
    cfg = curate.load_curate_config(overrides=[f"semantic.threshold={threshold}"])
    result = curate.run_stages(wh, ["semantic"], cfg)["semantic"]
    rows = [r for r in curate.read_rows(wh, COLS) if r["embedding"]]
    wh.close()
    assert result["duplicates"] > 0
    x = read_vectors([r["embedding"] for r in rows]).astype(np.float32)
    by_key = {r["image_key"]: i for i, r in enumerate(rows)}
    kept = [r for r in rows if r["sem_keep"]]
    dropped = [r for r in rows if not r["sem_keep"]]
    assert all(r["sem_kind"] == "" and r["sem_dup_of"] == r["image_key"] for r in kept)
    assert all(len(r["cluster"].split("/")) == 2 for r in rows)
    for r in dropped:  # a duplicate points at a kept row it is similar to and ranks after
        keeper = rows[by_key[r["sem_dup_of"]]]
        assert r["sem_kind"] == "semantic_duplicate" and keeper["sem_keep"]
        cos = float(x[by_key[r["image_key"]]] @ x[by_key[keeper["image_key"]]])
        assert cos >= threshold - 2e-3 and r["sem_similarity"] == pytest.approx(cos, abs=2e-3)
        area = lambda row: row["width"] * row["height"]  # noqa: E731
        assert (-area(keeper), keeper["seq"]) < (-area(r), r["seq"])
        assert curate.final_reason(r) == "semantic_duplicate"


def test_a_rerun_embeds_only_what_is_missing_and_the_pass_is_idempotent_and_spills(embedded):
    c, model, store, _ = embedded
    wh = curate.open_warehouse(c)
    before = {r["image_key"]: r for r in curate.read_rows(wh, COLS)}
    victim = next(k for k, r in before.items() if r["embedding"])
    with wh.funnel() as f:
        f.patch(curate.TABLE, [{"image_key": victim, "embedding": None, "embed_model": None}])
        f.flush()
    cfg = curate.load_curate_config(overrides=[f"embed.store={store}"])
    results = curate.run_stages(wh, ["embed", "semantic"], cfg, embedder=f"toy:{model}")
    once = {r["image_key"]: r for r in curate.read_rows(wh, COLS)}
    spill = curate.load_curate_config(overrides=["semantic.max_memory_mb=0"])
    curate.run_stages(wh, ["semantic"], spill)  # vectors through a memmap: same verdicts
    twice = {r["image_key"]: r for r in curate.read_rows(wh, COLS)}
    wh.close()
    assert results["embed"].completed == 1
    assert twice == once
    old, new = before.pop(victim), once.pop(victim)
    assert new["embedding"] != old["embedding"]  # its own batch file now
    # The same image through the same model, alone now and in a full batch before: CPU
    # kernels may block a batch of 1 differently (seen on an AVX2 AMD EPYC: 2 of 16 values
    # one float16 step apart), so equal to float16 rounding, not bit for bit.
    np.testing.assert_allclose(
        read_vectors([new["embedding"]]).astype(np.float32),
        read_vectors([old["embedding"]]).astype(np.float32),
        rtol=2e-3,
        atol=1e-4,
    )
    assert all(once[k]["embedding"] == r["embedding"] for k, r in before.items())


def test_a_dropped_cluster_rejects_its_rows_and_flags_survive_a_rerun(embedded):
    from krea2.curate.review import decide_cluster, flag_cluster, list_clusters, review_pass

    c, *_ = embedded
    wh = curate.open_warehouse(c)
    listed = {r["cluster"]: r for r in list_clusters(wh)}
    rows = [r for r in curate.read_rows(wh, COLS) if r["cluster"]]
    assert listed["0"]["size"] == len(rows) and listed["0"]["level"] == 1
    leaf = rows[0]["cluster"]
    members = {r["image_key"] for r in rows if r["cluster"] == leaf}
    assert listed[leaf]["size"] == len(members) and listed[leaf]["level"] == 2
    flag_cluster(wh, leaf, "looks like one concept", name="circles")
    curate.run_stages(wh, ["semantic"], curate.CurateConfig())
    assert [r["cluster"] for r in list_clusters(wh, flagged_only=True)] == [leaf]
    decide_cluster(wh, leaf, "drop", note="test")
    assert review_pass(wh) == {"rows": len(rows), "dropped": len(members)}
    read = curate.read_rows(wh, [*COLS, "cluster_reject"])
    reasons = {r["image_key"]: curate.final_reason(r) for r in read if r["cluster"]}
    assert {k for k, why in reasons.items() if why == "cluster_review"} == members
    decide_cluster(wh, leaf, "")
    assert review_pass(wh)["dropped"] == 0
    with pytest.raises(UserError, match="no cluster '9/9/9'"):
        flag_cluster(wh, "9/9/9", "x")
    with pytest.raises(UserError, match="use one of keep, drop"):
        decide_cluster(wh, leaf, "delete")
    wh.close()


def test_the_classify_job_scores_stored_vectors_with_every_head(embedded, tmp_path):
    from krea2.curate.distill import LinearHead

    c, *_ = embedded
    wh = curate.open_warehouse(c)
    rows = [r for r in curate.read_rows(wh, COLS) if r["embedding"]]
    x = read_vectors([r["embedding"] for r in rows])
    d = x.shape[1]
    heads = [
        LinearHead("a", tuple(np.linspace(-1, 1, d)), 0.1, 2.0, -0.5),
        LinearHead("b", tuple(np.ones(d) / d), 0.0),
    ]
    paths = ",".join(str(h.save(tmp_path / f"{h.task}.json")) for h in heads)
    result = curate.run_stages(wh, ["classify"], heads=paths)["classify"]
    got = {r["image_key"]: r["class_scores"] for r in curate.read_rows(wh, ["class_scores"])}
    wh.close()
    assert result.completed == len(rows)
    for h in heads:
        want = h.proba(x)
        np.testing.assert_allclose([got[r["image_key"]][h.task] for r in rows], want, atol=1e-6)
    with pytest.raises(UserError, match="needs classifier heads"):
        curate.check_stages(["classify"])
    with pytest.raises(UserError, match="no head file"):
        curate.check_stages(["classify"], heads=str(tmp_path / "absent.json"))


def test_the_embed_stage_needs_a_valid_embedder_spec(tmp_path):
    with pytest.raises(UserError, match="needs an embedder: pass --embedder KIND:PATH"):
        curate.check_stages(["embed"])
    with pytest.raises(UserError, match="KIND:PATH"):
        curate.check_stages(["embed"], embedder="clip-vit")
    empty = Path(tmp_path)
    with pytest.raises(UserError, match="has no weights"):
        load_embedder(f"toy:{empty}")
