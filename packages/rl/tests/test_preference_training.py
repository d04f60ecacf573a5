"""Preference optimization on the trainer's loop: metrics, exact resume after SIGKILL, and
FSDP on 2 gloo ranks equal to one process."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from krea2.infra.config import save_config
from krea2.infra.errors import UserError
from krea2.rl.preference import PreferenceConfig, train_preference
from krea2.trainer import load_job, read_metrics

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import held_env, kill_when_held, launch, newest_save_at, pair_job, write_pairs

STEPS = 6
PREF = PreferenceConfig(kind="stpo", beta=200.0)


def _rows(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_pairs(tmp_path_factory.mktemp("pairs"))


def _job(root: Path, shards: Path, **kw) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    job = pair_job(root, shards, STEPS, **kw)
    pref = save_config(PREF, root / "pref.toml")
    return job, pref


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, shards) -> list[dict]:
    job, pref = _job(tmp_path_factory.mktemp("single"), shards)
    out, _ = (proc := launch(1, str(job), str(pref))).communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return _rows(job.parent / "run")


@pytest.mark.numerics  # log 2 at the reference to 1e-6, under every kernel choice
def test_the_first_step_starts_at_the_reference_and_logs_the_preference_metrics(single_run):
    first = single_run[0]
    assert first["loss"] == pytest.approx(math.log(2), rel=1e-6)  # policy == reference
    assert first["winner_gap"] == pytest.approx(0, abs=1e-7)
    for key in ("winner_gap", "loser_gap", "margin", "accuracy", "winner_error", "grad_norm"):
        assert all(math.isfinite(r[key]) for r in single_run), key
    assert [r["step"] for r in single_run] == list(range(STEPS))
    assert single_run[-1]["margin"] > 0  # the pairs are learnable: the margin opens


def test_kill_and_resume_repeats_the_loss_sequence(tmp_path, shards, single_run):
    job, pref = _job(tmp_path, shards)
    # held after 5 of 6 steps (a pause point: it cannot train on or finish first), killed
    # once its newest checkpoint begun (step 2; pair_job's every = 3) is complete
    notice, saved = tmp_path / "paused", newest_save_at(5, every=3)
    proc = launch(1, str(job), str(pref), env=held_env("preference", 5, notice))
    kill_when_held(proc, notice, tmp_path / "run" / "checkpoints" / "preference", saved)
    assert max(r["step"] for r in _rows(tmp_path / "run")) == 4
    out, _ = (proc := launch(1, str(job), str(pref), "--resume")).communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert f"resumed stage preference at step {saved + 1}" in out
    by_step = {r["step"]: r for r in _rows(tmp_path / "run")}  # resumed rows overwrite
    assert sorted(by_step) == list(range(STEPS))
    for ref in single_run:
        assert by_step[ref["step"]]["loss"] == pytest.approx(ref["loss"], rel=1e-6, abs=1e-9)


def test_fsdp_on_two_gloo_ranks_equals_one_process(tmp_path, shards, single_run):
    job, pref = _job(tmp_path, shards, every=0)
    out, _ = (proc := launch(2, str(job), str(pref))).communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    rows = _rows(tmp_path / "run")
    assert len(rows) == STEPS
    for a, b in zip(single_run, rows, strict=True):
        for key in ("loss", "winner_gap", "loser_gap", "margin", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_an_odd_batch_is_refused_before_training(tmp_path, shards):
    job, _ = _job(tmp_path, shards)
    cfg = load_job(job, ["stages.0.batch_size=5"])
    with pytest.raises(UserError, match="multiple of 2"):
        train_preference(cfg, PREF)


def test_caption_dropout_drops_whole_pairs_alike_on_one_and_two_ranks(tmp_path, shards, single_run):
    """Caption dropout trains some pairs with the empty caption (the unconditional branch):
    the first step is still log 2 (policy == reference), later steps leave the run without
    dropout, and the drop decisions are the pair's own (2 gloo ranks equal 1 rank)."""
    runs = []
    for nproc in (1, 2):
        root = tmp_path / f"ranks{nproc}"
        job, pref = _job(root, shards, every=0)
        job.write_text(job.read_text().replace("caption_dropout = 0.0", "caption_dropout = 0.5"))
        out, _ = (proc := launch(nproc, str(job), str(pref))).communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
        runs.append(_rows(root / "run"))
    one, two = runs
    assert one[0]["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert any(
        abs(a["loss"] - b["loss"]) > 1e-6 for a, b in zip(one[1:], single_run[1:], strict=True)
    )
    for a, b in zip(one, two, strict=True):
        for key in ("loss", "winner_gap", "loser_gap", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
