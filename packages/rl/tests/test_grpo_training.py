"""GRPO and DiffusionNFT on the trainer's loop, through ``krea2 rl grpo``'s torchrun entry:
the first inner step's importance ratio is exactly 1, the metrics are logged, a killed run
resumes to the same numbers (rollout RNG included), and 2 gloo ranks equal 1 rank."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from krea2.trainer import read_metrics, write_toy_shards
from krea2.trainer.testing import tiny_job_head

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import held_env, kill_when_held, launch_module, newest_save_at

STEPS = 3


def _launch(
    nproc: int, module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    return launch_module(nproc, module, *args, env=env)


def _killed_after_two_steps(run: Path, *args: str) -> int:
    """``krea2.rl.online.train ARGS`` held after 2 of its 3 steps (a pause point: it cannot
    train on or finish first), SIGKILLed once its newest checkpoint begun (step 0; every step
    checkpoints, step 1's save comes after the pause) is complete; returns that step."""
    notice, saved = run.parent / "paused", newest_save_at(2, every=1)
    proc = _launch(1, "krea2.rl.online.train", *args, env=held_env("rl", 2, notice))
    kill_when_held(proc, notice, run / "checkpoints" / "rl", saved)
    assert max(r["step"] for r in _rows(run)) == 1  # step 1 logged, then held
    return saved


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A toy run (2 blocks, width 64, 32 px) trained 1 step: the start of every RL run."""
    root = tmp_path_factory.mktemp("pretrained")
    write_toy_shards(root / "shards", 16, (32, 32), files=1, batch_size=8)
    job = root / "job.toml"
    job.write_text(
        tiny_job_head(root / "run", every=0, keep_last=3)
        + f"""[[stages]]
name = "base"
data = ["{root / "shards"}/*.parquet"]
init_from = "none"
steps = 1
batch_size = 8
"""
    )
    out, _ = (proc := _launch(1, "krea2.trainer", "--config", str(job))).communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return root / "run"


def _config(root: Path, pretrained: Path, objective: str = "grpo", every: int = 1) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    prompts = root / "prompts.txt"
    prompts.write_text("".join(f"blob {i} in cell {i % 9}\n" for i in range(8)))
    path = root / "rl.toml"
    path.write_text(f"""
pretrained = "{pretrained}"
run_dir = "{root / "run"}"
prompts_file = "{prompts}"
steps = {STEPS}
prompts_per_step = 2
lr = 1e-3
checkpoint_every = {every}
[grpo]
objective = "{objective}"
group_size = 4
sample_steps = 4
window_size = 2
window_start_max = 1
micro_batch = 4
inner_steps = 2
clip = 0.2
kl_beta = 0.1
aggregation = "gdpo"
rewards = {{ smooth = "smooth", rubric = "rubric" }}
weights = {{ smooth = 1.0, rubric = 0.5 }}
""")
    return path


def _rows(run: Path) -> list[dict]:
    return [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, pretrained) -> list[dict]:
    cfg = _config(tmp_path_factory.mktemp("single"), pretrained)
    out, _ = (proc := _launch(1, "krea2.rl.online.train", str(cfg))).communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return _rows(cfg.parent / "run")


@pytest.mark.numerics  # the first ratio is 1 to 1e-6 on the real DiT, under every kernel choice
def test_first_inner_step_ratio_is_one_and_metrics_are_logged(single_run):
    assert [r["step"] for r in single_run] == list(range(STEPS))
    for row in single_run:
        # recomputed with the rollout's arithmetic and batch rows: exactly the same
        assert row["first_ratio_max_dev"] <= 1e-6, row
        for key in ("loss", "kl", "ratio_mean", "clip_fraction", "reward_smooth",
                    "reward_rubric", "time_rollout", "time_reward", "time_train"):  # fmt: skip
            assert math.isfinite(row[key]), key
        assert row["rollout_images"] == 8
    # the second minibatch of a step sees updated weights: its ratio moved off 1
    assert any(abs(r["ratio_mean"] - 1) > 1e-7 for r in single_run)
    # KL to the reference: 0 on the first minibatch (policy = reference), then positive
    assert all(r["kl"] >= 0 for r in single_run) and single_run[-1]["kl"] > 0


@pytest.mark.slow
def test_nft_objective_trains_on_the_same_loop(tmp_path, pretrained):
    cfg = _config(tmp_path, pretrained, "nft")
    out, _ = (proc := _launch(1, "krea2.rl.online.train", str(cfg), "--set",
                              "grpo.window_size=0", "--set", "grpo.window_start_max=0",
                              "--set", "grpo.kl_beta=0")).communicate(timeout=300)  # fmt: skip
    assert proc.returncode == 0, out[-3000:]
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(math.isfinite(r["loss"]) and 0 <= r["optimality_mean"] <= 1 for r in rows)


@pytest.mark.slow
def test_nft_kl_term_is_zero_at_the_reference_and_grows_after_updates(tmp_path, pretrained):
    cfg = _config(tmp_path, pretrained, "nft")  # kl_beta = 0.1: the trainer keeps a reference
    out, _ = (proc := _launch(1, "krea2.rl.online.train", str(cfg), "--set",
                              "grpo.window_size=0", "--set",
                              "grpo.window_start_max=0")).communicate(timeout=300)  # fmt: skip
    assert proc.returncode == 0, out[-3000:]
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert rows[0]["kl"] <= 1e-12  # the policy is the reference before its first update
    assert rows[-1]["kl"] > 0 and all(math.isfinite(r["loss"]) for r in rows)


@pytest.mark.slow
def test_kill_and_resume_repeats_the_rollouts_and_losses(tmp_path, pretrained, single_run):
    cfg = _config(tmp_path, pretrained)
    saved = _killed_after_two_steps(tmp_path / "run", str(cfg))
    out, _ = (proc := _launch(1, "krea2.rl.online.train", str(cfg), "--resume")).communicate(
        timeout=300
    )
    assert proc.returncode == 0, out[-3000:]
    assert f"resumed stage rl at step {saved + 1}" in out
    by_step = {r["step"]: r for r in _rows(tmp_path / "run")}
    assert sorted(by_step) == list(range(STEPS))
    for ref in single_run:
        for key in ("loss", "reward_smooth", "ratio_mean", "kl"):
            assert by_step[ref["step"]][key] == pytest.approx(ref[key], rel=1e-5, abs=1e-9)


NFT_OLD = ["--set", "grpo.window_size=0", "--set", "grpo.window_start_max=0", "--set",
           "grpo.kl_beta=0", "--set", "grpo.nft_old_decay=0.5"]  # fmt: skip


@pytest.mark.slow
def test_nft_old_policy_is_checkpointed_and_a_resume_repeats_the_run(tmp_path, pretrained):
    whole = _config(tmp_path / "whole", pretrained, "nft")
    out, _ = (proc := _launch(1, "krea2.rl.online.train", str(whole), *NFT_OLD)).communicate(
        timeout=300
    )
    assert proc.returncode == 0, out[-3000:]
    ref = {r["step"]: r for r in _rows(tmp_path / "whole" / "run")}
    cut = _config(tmp_path / "cut", pretrained, "nft")
    run = tmp_path / "cut" / "run"
    # killed after step 1: the resume loads (step 0's) old policy, which lags the weights
    saved = _killed_after_two_steps(run, str(cut), *NFT_OLD)
    args = ("krea2.rl.online.train", str(cut), "--resume", *NFT_OLD)
    out, _ = (proc := _launch(1, *args)).communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert f"resumed stage rl at step {saved + 1}" in out
    by_step = {r["step"]: r for r in _rows(run)}
    assert sorted(by_step) == sorted(ref) == list(range(STEPS))
    for step, row in ref.items():
        for key in ("loss", "reward_smooth", "optimality_mean"):
            assert by_step[step][key] == pytest.approx(row[key], rel=1e-5, abs=1e-9), (step, key)


@pytest.mark.slow
def test_fsdp_on_two_gloo_ranks_equals_one_process(tmp_path, pretrained):
    # one minibatch per iteration: with inner_steps > 1 each rank splits its own rollouts,
    # so the minibatches of 2 ranks hold other images than 1 rank's
    runs = {}
    for nproc in (1, 2):
        cfg = _config(tmp_path / f"ranks{nproc}", pretrained, every=0)
        proc = _launch(nproc, "krea2.rl.online.train", str(cfg), "--set", "grpo.inner_steps=1")
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
        runs[nproc] = _rows(cfg.parent / "run")
    assert len(runs[1]) == len(runs[2]) == STEPS
    for a, b in zip(runs[1], runs[2], strict=True):
        assert a["first_ratio_max_dev"] <= 1e-6 and b["first_ratio_max_dev"] <= 1e-6
        for key in ("loss", "reward_smooth", "reward_rubric", "ratio_mean", "kl", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
