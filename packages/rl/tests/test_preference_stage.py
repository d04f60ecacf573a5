"""The demo's preference stage on a tiny pretrained toy run (32 px, then 64 px at patch 8
with split prediction, as the demo): results, reuse and resume under one work dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from krea2.curate.shapes import eval_prompt, split_concepts
from krea2.infra.errors import UserError
from krea2.rl.preference import PreferenceStageSettings, preference_stage
from krea2.rl.rewards import RewardOutput, check_batch
from krea2.trainer import Trainer, load_job, write_toy_shards
from krea2.trainer.testing import tiny_job_head


class Brightness:
    """A cheap deterministic reward: brighter is better; its ``artifact`` part is the
    share of non-black pixels (a stand-in for 1 - P(defect))."""

    name = "brightness"

    def __call__(self, images, prompts):
        pixels, _ = check_batch(images, prompts)
        bright = pixels.mean(axis=(1, 2, 3)).astype(np.float32) / 255
        lit = (pixels.max(axis=3) > 40).mean(axis=(1, 2)).astype(np.float32)
        return RewardOutput(bright + 0.5 * lit, {"artifact": lit})


SETTINGS = PreferenceStageSettings(
    max_train_prompts=6, samples_per_prompt=2, sample_steps=2, sample_cfg=2.0,
    eval_seeds=[0, 1], steps=4, batch_size=4, lr=1e-3, warmup_steps=1, log_every=1,
    checkpoint_every=2,
)  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    root = tmp_path_factory.mktemp("pre")
    for side in (32, 64):
        write_toy_shards(root / f"d{side}", 32, (side, side), files=1)
    path = root / "job.toml"
    head = tiny_job_head(
        root / "run", every=0, keep_last=3, prediction="split", max_tokens=12, deterministic=False
    )
    path.write_text(
        head
        + f"""[[stages]]
name = "p32"
data = ["{root / "d32"}"]
resolution = 32
steps = 3
batch_size = 8
[[stages]]
name = "p64"
data = ["{root / "d64"}"]
resolution = 64
patch = 8
steps = 2
batch_size = 8
"""
    )
    job = load_job(path)
    Trainer(job).run()
    return job


def prompts():
    split = split_concepts(0)
    return [eval_prompt(c) for c in split.train[:8]], [eval_prompt(c) for c in split.held_out[:3]]


@pytest.mark.numerics  # log 2 at the reference to 1e-6; measures repeat bit for bit
def test_stpo_then_dpo_share_pairs_and_report_curves_measures_and_samples(pretrained, tmp_path):
    train, held = prompts()
    work = tmp_path / "pref"
    stpo = preference_stage(pretrained, 1, work, train, held, Brightness(), "stpo", SETTINGS)
    assert stpo["curves"]["step"] == [0.0, 1.0, 2.0, 3.0]
    assert stpo["curves"]["loss"][0] == pytest.approx(np.log(2), rel=1e-6)  # policy == reference
    assert stpo["pairs"] == 6 and stpo["batch_size"] == 4
    images = np.load(stpo["samples"])
    assert images.shape == (3, 2, 64, 64, 3) and images.dtype == np.uint8
    for m in (stpo["pretrained"], stpo["tuned"]):
        assert 0 <= m["shapes_eval"] <= 1 and 0 <= m["artifact"] <= 1 and m["hf_energy"] > 0
    assert stpo["hf_energy_ratio"] == pytest.approx(
        stpo["tuned"]["hf_energy"] / stpo["pretrained"]["hf_energy"]
    )
    json.dumps(stpo)  # JSON-able as it is
    pairs = (work / "pairs.json").stat().st_mtime_ns
    pretrained_eval = (work / "eval-pretrained.npy").stat().st_mtime_ns
    dpo = preference_stage(pretrained, 1, work, train, held, Brightness(), "dpo", SETTINGS)
    assert (work / "pairs.json").stat().st_mtime_ns == pairs  # reused, not regenerated
    assert (work / "eval-pretrained.npy").stat().st_mtime_ns == pretrained_eval
    assert dpo["pretrained"] == stpo["pretrained"] and dpo["samples"] != stpo["samples"]
    assert dpo["curves"]["loss"][0] == pytest.approx(np.log(2), rel=1e-6)
    # the pretraining run is untouched: no preference checkpoint lands in it
    assert not (Path(pretrained.run_dir) / "checkpoints" / "preference").exists()


def test_a_rerun_resumes_training_from_its_checkpoint(pretrained, tmp_path):
    train, held = prompts()
    work = tmp_path / "pref"
    first = preference_stage(pretrained, 1, work, train, held, Brightness(), "stpo", SETTINGS)
    # as if stopped after the step-1 checkpoint: no result, no finished stage, no step 3
    ckpts = work / "stpo" / "checkpoints"
    (work / "stpo.json").unlink()
    (work / "eval-stpo.npy").unlink()
    (ckpts / "preference.done").unlink()
    shutil.rmtree(ckpts / "preference" / "step-000000003")
    again = preference_stage(pretrained, 1, work, train, held, Brightness(), "stpo", SETTINGS)
    log = (work / "stpo" / "train.log.jsonl").read_text()
    assert "resumed stage preference at step 2" in log
    assert again["curves"]["step"] == first["curves"]["step"]
    assert again["curves"]["loss"] == pytest.approx(first["curves"]["loss"], rel=1e-4)
    assert again["pairs"] == first["pairs"]


def test_other_pair_settings_on_the_same_work_dir_are_refused(pretrained, tmp_path):
    train, held = prompts()
    work = tmp_path / "pref"
    small = PreferenceStageSettings(**{**SETTINGS.__dict__, "steps": 1, "checkpoint_every": 0})
    preference_stage(pretrained, 1, work, train, held, Brightness(), "dpo", small)
    other = PreferenceStageSettings(**{**small.__dict__, "samples_per_prompt": 4})
    with pytest.raises(UserError, match="holds pairs made with"):
        preference_stage(pretrained, 1, work, train, held, Brightness(), "stpo", other)
    with pytest.raises(UserError, match="objective 'ppo'"):
        preference_stage(pretrained, 1, work, train, held, Brightness(), "ppo", small)


class Flat:
    """A reward that ties everything (as the rubric and artifact rewards do on a smoke
    model's noise)."""

    name = "flat"

    def __call__(self, images, prompts):
        pixels, _ = check_batch(images, prompts)
        return RewardOutput(np.zeros(len(pixels), np.float32), {})


def test_a_model_too_weak_to_rank_gives_no_pair_and_trains_nothing(pretrained, tmp_path):
    train, held = prompts()
    r = preference_stage(pretrained, 1, tmp_path / "w", train, held, Flat(), "stpo", SETTINGS)
    assert r["pairs"] == 0 and "no preference pair" in r["note"]
    assert r["curves"]["step"] == [] and r["tuned"] == r["pretrained"]
    assert not (tmp_path / "w" / "stpo").exists()
