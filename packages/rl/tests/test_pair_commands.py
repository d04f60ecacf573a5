"""``krea2 rl make-pairs`` and ``krea2 rl export-pairs`` as a user runs them: pairs from a
trained run, shards from a pairs.json or the annotated pairs table (a real embedded shard),
the one-line errors, and the whole path into ``train-preference``."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from krea2.infra.host import run_cli
from krea2.rl.cli import app
from krea2.rl.preference import (
    SmoothnessReward,
    open_pairs,
    read_pairs_file,
    set_choice,
    write_pairs,
    write_pairs_file,
)
from krea2.trainer import read_metrics, write_toy_shards
from krea2.trainer.cli import run_job
from krea2.trainer.testing import tiny_job_head

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import COLORS, square, toy_pairs


def tiny_job(run_dir: Path) -> str:
    """The tiny toy job (12 text tokens, torch's default kernels) up to its stages, each
    stage checkpointed at its end."""
    return tiny_job_head(run_dir, every=0, keep_last=3, max_tokens=12, deterministic=False)


def rl(*args: object) -> int:
    return run_cli(app, [str(a) for a in args])


def shard_rows(out: Path) -> list[dict]:
    files = sorted(out.glob("*.parquet"))
    assert len(files) == 1
    return pq.read_table(files[0]).to_pylist()


def pairs_file(tmp_path: Path, n: int = 6) -> Path:
    return write_pairs_file(tmp_path / "pairs.json", toy_pairs(tmp_path / "png", n))


# --- export-pairs ------------------------------------------------------------------------


def test_export_from_a_pairs_file_writes_whole_pairs_in_a_seeded_order(tmp_path, capsys):
    path = pairs_file(tmp_path)
    pairs = read_pairs_file(path)
    assert rl("export-pairs", "--pairs", path, "--out", tmp_path / "a") == 0
    assert "wrote 6 pairs (12 images, 32x32)" in capsys.readouterr().out
    rows = shard_rows(tmp_path / "a")
    assert [r["key"].split("/")[1] for r in rows] == ["winner", "loser"] * 6
    assert [r["key"].split("/")[0] for r in rows[::2]] == [
        r["key"].split("/")[0] for r in rows[1::2]
    ]
    assert {r["key"].split("/")[0] for r in rows} == {p.pair_id for p in pairs}
    assert {r["bucket"] for r in rows} == {"32x32"}
    by_key = {r["key"]: r for r in rows}
    p = pairs[3]
    assert by_key[f"{p.pair_id}/winner"]["image"] == Path(p.winner_uri[7:]).read_bytes()
    assert by_key[f"{p.pair_id}/loser"]["captions"] == [{"format": "medium", "text": p.prompt}]
    assert rl("export-pairs", "--pairs", path, "--out", tmp_path / "b") == 0
    assert rl("export-pairs", "--pairs", path, "--out", tmp_path / "c", "--seed", "1") == 0
    keys = [[r["key"] for r in shard_rows(tmp_path / d)] for d in "abc"]
    assert keys[0] == keys[1] and keys[0] != keys[2]  # --seed shuffles whole pairs


def test_an_image_of_another_size_is_named_unless_resized(tmp_path, capsys):
    path = pairs_file(tmp_path, 3)
    first = read_pairs_file(path)
    assert rl("export-pairs", "--pairs", path, "--out", tmp_path / "a", "--side", "16") == 2
    err = capsys.readouterr().err
    assert "is 32x32, not 16x16" in err and "--resize" in err
    assert any(f"pair {p.pair_id!r}" in err for p in first)
    assert not (tmp_path / "a").exists() or not list((tmp_path / "a").glob("*.parquet"))
    args = ("--pairs", path, "--out", tmp_path / "b", "--side", "16", "--resize")
    assert rl("export-pairs", *args) == 0
    sizes = {Image.open(io.BytesIO(r["image"])).size for r in shard_rows(tmp_path / "b")}
    assert sizes == {(16, 16)}


def test_export_mistakes_are_one_line_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KRABLET_CLUSTER", raising=False)
    path = pairs_file(tmp_path, 2)
    cases = [
        (("--pairs", tmp_path / "nope.json"), "nope.json does not exist"),
        ((), "give the pairs: --pairs FILE"),
        (("--pairs", path, "--cluster", "x.json"), "not both"),
    ]
    (tmp_path / "bad.json").write_text('{"pairs": [{"prompt": "p"}]}')
    cases.append((("--pairs", tmp_path / "bad.json"), "is not a pairs file"))
    write_pairs_file(tmp_path / "empty.json", [])
    cases.append((("--pairs", tmp_path / "empty.json"), "holds no pair"))
    for args, message in cases:
        assert rl("export-pairs", *args, "--out", tmp_path / "out") == 2, args
        assert message in capsys.readouterr().err, args
    assert rl("export-pairs", "--pairs", path, "--out", tmp_path / "out") == 0
    assert rl("export-pairs", "--pairs", path, "--out", tmp_path / "out") == 2
    assert "already holds shards" in capsys.readouterr().err


def test_the_table_orients_pairs_by_choice_and_leaves_skipped_ones_out(
    cluster_file, tmp_path, capsys
):
    pairs = toy_pairs(tmp_path / "png", 4)
    with open_pairs(str(cluster_file)) as wh:
        write_pairs(wh, pairs)
        set_choice(wh, pairs[0].pair_id, "loser", "ann")  # flipped
        set_choice(wh, pairs[1].pair_id, "skip", "ann")
        set_choice(wh, pairs[2].pair_id, "winner", "ann")
    out = tmp_path / "all"
    assert rl("export-pairs", "--cluster", cluster_file, "--out", out) == 0
    said = capsys.readouterr().out
    assert "wrote 3 pairs" in said and "left out 1 skipped" in said and "1 flipped" in said
    rows = {r["key"]: r for r in shard_rows(out)}
    assert f"{pairs[1].pair_id}/winner" not in rows
    flipped = rows[f"{pairs[0].pair_id}/winner"]
    assert flipped["image"] == Path(pairs[0].loser_uri[7:]).read_bytes()

    out = tmp_path / "chosen"
    assert rl("export-pairs", "--cluster", cluster_file, "--out", out, "--annotated-only") == 0
    assert "1 not annotated" in capsys.readouterr().out
    assert {k.split("/")[0] for k in (r["key"] for r in shard_rows(out))} == {
        pairs[0].pair_id,
        pairs[2].pair_id,
    }

    with open_pairs(str(cluster_file)) as wh:
        for p in pairs:
            set_choice(wh, p.pair_id, "skip")
    assert rl("export-pairs", "--cluster", cluster_file, "--out", tmp_path / "none") == 2
    err = capsys.readouterr().err
    assert "no pair left to export: of the 4 in table 'preference_pairs', 4 skipped" in err
    args = ("--cluster", cluster_file, "--table", "other_pairs", "--out", tmp_path / "none")
    assert rl("export-pairs", *args) == 2
    assert "table 'other_pairs' holds no pair" in capsys.readouterr().err


# --- the smoothness reward -----------------------------------------------------------------


def test_smoothness_reward_prefers_the_image_without_speckle():
    clean = np.stack([square(COLORS["red"], c) for c in range(3)])
    noisy = np.clip(clean + np.random.default_rng(0).normal(0, 40, clean.shape), 0, 255)
    out = SmoothnessReward()(np.concatenate([clean, noisy.astype(np.uint8)]), ["a"] * 6)
    assert out.scores.dtype == np.float32 and out.scores.shape == (6,)
    assert (out.scores[:3] > out.scores[3:]).all()
    np.testing.assert_allclose(out.scores, 1 - out.sub_scores["hf_energy"], atol=1e-6)
    assert len(SmoothnessReward()(np.zeros((0, 8, 8, 3), np.uint8), [])) == 0


# --- make-pairs and the whole path -------------------------------------------------------


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory) -> Path:
    """A tiny toy run (3 steps at 32 px) made by the trainer's command path, so its run
    directory holds config.toml as ``krea2 train`` leaves it."""
    root = tmp_path_factory.mktemp("run")
    write_toy_shards(root / "d32", 32, (32, 32), files=1)
    job = root / "job.toml"
    job.write_text(
        tiny_job(root / "run")
        + f"""[[stages]]
name = "p32"
data = ["{root / "d32"}"]
resolution = 32
steps = 3
batch_size = 8
"""
    )
    run_job(job, [], resume=False)
    return root / "run"


def prompts_file(tmp_path: Path, n: int = 4) -> Path:
    path = tmp_path / "prompts.txt"
    lines = ["# toy prompts", *(f"blob {k} in cell {k}" for k in range(n)), ""]
    path.write_text("\n".join(lines))
    return path


@pytest.mark.numerics  # log 2 at the reference to 1e-6; measures repeat bit for bit
def test_make_pairs_export_and_train_preference_from_the_command_line(
    pretrained_run, tmp_path, capsys
):
    out = tmp_path / "pairs"
    args = ("--stage", "p32", "--prompts", prompts_file(tmp_path), "--samples-per-prompt", 3,
            "--sample-steps", 2, "--reward", "smooth", "--seed", 10, "--out", out)  # fmt: skip
    assert rl("make-pairs", pretrained_run, *args) == 0
    assert "wrote 4 pairs of 4 prompts" in capsys.readouterr().out
    saved = json.loads((out / "pairs.json").read_text())
    assert saved["settings"]["stage"] == "p32" and saved["settings"]["model_step"] == 2
    pairs = read_pairs_file(out / "pairs.json")
    assert [p.prompt for p in pairs] == [f"blob {k} in cell {k}" for k in range(4)]
    for p in pairs:
        assert p.scores["winner"] > p.scores["loser"] and p.winner_seed in (10, 11, 12)
        assert Path(p.winner_uri[7:]).is_file() and Path(p.winner_uri[7:]).is_absolute()
    assert len(list((out / "images").glob("*.png"))) == 12
    assert rl("make-pairs", pretrained_run, *args) == 2  # never overwrites pairs
    assert "pairs.json exists" in capsys.readouterr().err

    shards = tmp_path / "shards"
    assert rl("export-pairs", "--pairs", out / "pairs.json", "--out", shards) == 0
    job = tmp_path / "pref.toml"
    job.write_text(
        tiny_job(tmp_path / "pref-run")
        + f"""[[stages]]
name = "preference"
data = ["{shards}/*.parquet"]
resolution = 32
steps = 2
batch_size = 4
caption_dropout = 0.0
init_from = "{pretrained_run / "checkpoints" / "p32"}"
[stages.caption_weights]
medium = 1.0
[stages.schedule]
warmup_steps = 0
"""
    )
    assert rl("train-preference", "--config", job, "--objective", "dpo") == 0
    rows = [
        r for r in read_metrics(tmp_path / "pref-run" / "metrics.jsonl") if r["kind"] == "train"
    ]
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["loss"] == pytest.approx(np.log(2), rel=1e-6)  # starts at the reference
    assert {"winner_gap", "loser_gap", "margin"} <= set(rows[0])


def test_make_pairs_mistakes_are_one_line_errors(pretrained_run, tmp_path, capsys):
    prompts = prompts_file(tmp_path, 3)
    base = (pretrained_run, "--out", tmp_path / "o", "--sample-steps", 1)
    cases = [
        ((), "--prompts FILE (one a line) or --shapes N"),
        (("--prompts", prompts, "--shapes", 4), "not both"),
        (("--prompts", tmp_path / "none.txt"), "none.txt does not exist"),
        (("--prompts", prompts, "--samples-per-prompt", 1), "a pair needs at least 2"),
        (("--prompts", prompts, "--samples-per-prompt", 3, "--pairs-per-prompt", 2), "1..1"),
        (("--prompts", prompts, "--stage", "p99"), "'p99' is not a stage"),
        (("--prompts", prompts, "--reward", "nope"), "--reward: unknown reward 'nope'"),
    ]
    for args, message in cases:
        assert rl("make-pairs", *base, *args) == 2, args
        assert message in capsys.readouterr().err, args
    assert rl("make-pairs", tmp_path, "--prompts", prompts, "--out", tmp_path / "o") == 2
    assert "has no config.toml" in capsys.readouterr().err
    # the rubric has nothing to verify in a blob prompt: every sample scores 1, no pair
    assert rl("make-pairs", *base, "--prompts", prompts, "--reward", "rubric") == 2
    err = capsys.readouterr().err
    assert "no pair: the reward 'rubric' scored the 4 samples of each of the 3 prompts" in err
    assert not (tmp_path / "o" / "pairs.json").exists()


def test_shapes_prompts_are_the_demos_training_concepts(pretrained_run, tmp_path):
    from krea2.curate.shapes import eval_prompt, split_concepts

    args = ("--shapes", 3, "--samples-per-prompt", 2, "--sample-steps", 1, "--reward", "smooth")
    assert rl("make-pairs", pretrained_run, *args, "--out", tmp_path / "o") == 0
    split = split_concepts(0, 0.15)
    train = {eval_prompt(c) for c in split.train}
    prompts = [p.prompt for p in read_pairs_file(tmp_path / "o" / "pairs.json")]
    assert len(prompts) == 3 and set(prompts) <= train
    assert not set(prompts) & {eval_prompt(c) for c in split.held_out}
