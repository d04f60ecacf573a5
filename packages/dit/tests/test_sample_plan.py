"""What `dit sample` samples with: model folders, scheduler shift settings, the weights'
conditioning record, and the refusals for what it cannot reproduce."""

from __future__ import annotations

import json
import math

import pytest

from krea2.dit.flow import TURBO_MU, TimeShift
from krea2.dit.model import Krea2DiT
from krea2.dit.release import read_model_folder, read_time_shift
from krea2.dit.sample_plan import plan_sample
from krea2.dit.weights import CheckpointError, save_weights
from krea2.infra.errors import UserError


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Tiny DiT weights without a conditioning record (released or converted files)."""
    return save_weights(
        Krea2DiT.from_config("tiny"), tmp_path_factory.mktemp("w") / "p.safetensors"
    )


def recorded(tmp_path, **record):
    return save_weights(
        Krea2DiT.from_config("tiny"), tmp_path / "r.safetensors", conditioning=record
    )


def scheduler_folder(tmp_path, conf, index=None):
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(conf))
    if index is not None:
        (tmp_path / "model_index.json").write_text(json.dumps(index))
    return tmp_path


def test_weights_without_a_record_keep_todays_defaults(plain):
    plan = plan_sample(weights=plain)
    assert (str(plan.text_encoder), str(plan.autoencoder)) == ("tiny", "pixel")
    assert (plan.text_tokens, plan.prediction, plan.time_shift) == (512, "velocity", TimeShift())


def test_recorded_conditioning_is_the_default_and_flags_override_it(tmp_path):
    path = recorded(tmp_path, text_encoder="tiny:3", prediction="x0", shift=0.7, text_tokens=16,
                    autoencoder="pixel:2", x0_min_t=0.1)  # fmt: skip
    plan = plan_sample(weights=path)
    assert (str(plan.text_encoder), str(plan.autoencoder)) == ("tiny:3", "pixel:2")
    assert (plan.text_tokens, plan.prediction, plan.x0_min_t) == (16, "x0", 0.1)
    assert plan.time_shift == TimeShift(fixed=0.7)
    plan = plan_sample(weights=path, text_encoder="tiny:3", mu=1.0, text_tokens=8)
    assert plan.time_shift == TimeShift(fixed=1.0) and plan.text_tokens == 8
    assert plan_sample(weights=path, turbo=True).time_shift == TimeShift(fixed=TURBO_MU)


def test_conditioning_only_the_trainer_rebuilds_is_refused(tmp_path):
    path = recorded(tmp_path, text_encoder="trainer:words")
    with pytest.raises(UserError, match=r"'trainer:words'.*`krea2 train sample RUN_DIR"):
        plan_sample(weights=path)
    with pytest.raises(UserError, match="'trainer:words', which --text-encoder tiny cannot"):
        plan_sample(weights=path, text_encoder="tiny")


def test_a_different_text_encoder_than_recorded_is_refused(tmp_path):
    path = recorded(tmp_path, text_encoder="tiny:3")
    with pytest.raises(UserError, match="or pass --text-encoder tiny:3"):
        plan_sample(weights=path, text_encoder="tiny:4")
    with pytest.raises(UserError, match="'tiny:3', which --text-encoder qwen3-vl:/m cannot"):
        plan_sample(weights=path, text_encoder="qwen3-vl:/m")


def test_a_recorded_path_encoder_may_be_found_elsewhere(tmp_path):
    path = recorded(tmp_path, text_encoder="qwen3-vl:/train/box/qwen")
    assert str(plan_sample(weights=path).text_encoder) == "qwen3-vl:/train/box/qwen"
    moved = plan_sample(weights=path, text_encoder="qwen3-vl:/here/qwen")
    assert str(moved.text_encoder) == "qwen3-vl:/here/qwen"


def test_a_prediction_dit_sample_cannot_make_is_refused(tmp_path):
    path = recorded(tmp_path, text_encoder="tiny", prediction="split")
    with pytest.raises(UserError, match=r"predicts 'split'.*krea2 train sample"):
        plan_sample(weights=path)


def test_a_training_checkpoint_points_at_train_sample_and_pma(tmp_path):
    step = tmp_path / "runs" / "toy" / "checkpoints" / "pretrain" / "step-000000099"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    msg = f"krea2 train sample {tmp_path / 'runs' / 'toy'} --stage pretrain"
    with pytest.raises(CheckpointError, match="training checkpoint") as e:
        plan_sample(weights=step)
    assert msg in str(e.value) and "krea2 train pma" in str(e.value)


def test_neither_model_nor_weights_is_a_usage_error():
    with pytest.raises(UserError, match=r"--model FOLDER .* or --weights FILE"):
        plan_sample()


@pytest.mark.parametrize(
    ("conf", "index", "want"),
    [
        ({"use_dynamic_shifting": True, "base_shift": 0.3, "max_shift": 1.2,
          "base_image_seq_len": 100, "max_image_seq_len": 1000}, None,
         TimeShift(x1=100, y1=0.3, x2=1000, y2=1.2)),
        ({"use_dynamic_shifting": True}, {"is_distilled": False}, TimeShift()),
        ({"use_dynamic_shifting": True}, {"is_distilled": True}, TimeShift(fixed=TURBO_MU)),
        ({"use_dynamic_shifting": False, "shift": 3.0}, None, TimeShift(fixed=math.log(3.0))),
    ],
)  # fmt: skip
def test_scheduler_shift_settings(tmp_path, conf, index, want):
    assert read_time_shift(scheduler_folder(tmp_path, conf, index)) == want


def test_unsupported_or_malformed_scheduler_configs_name_the_file(tmp_path):
    folder = scheduler_folder(tmp_path, {"use_dynamic_shifting": True, "use_karras_sigmas": True})
    with pytest.raises(CheckpointError, match=r"scheduler_config\.json: use_karras_sigmas"):
        read_time_shift(folder)
    (folder / "scheduler" / "scheduler_config.json").write_text('{"shift": ')
    with pytest.raises(CheckpointError, match=r"scheduler_config\.json is not valid JSON"):
        read_time_shift(folder)


def test_a_folder_without_a_dit_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"needs transformer/config\.json .*\(found: none\)"):
        read_model_folder(tmp_path)


def test_native_folder_with_flags_for_missing_parts(plain, tmp_path):
    (tmp_path / "dit.safetensors").write_bytes(plain.read_bytes())
    folder = read_model_folder(tmp_path)
    assert folder.transformer == tmp_path / "dit.safetensors"
    assert (folder.text_encoder, folder.autoencoder, folder.time_shift) == (None, None, None)
    plan = plan_sample(model=tmp_path, text_encoder="tiny:1")
    assert plan.weights == tmp_path / "dit.safetensors" and str(plan.text_encoder) == "tiny:1"


def test_steps_and_cfg_come_from_the_flags_the_record_a_turbo_folder_or_the_defaults(
    plain, tmp_path
):
    assert (plan_sample(weights=plain).steps, plan_sample(weights=plain).cfg) == (28, 4.5)
    turbo = plan_sample(weights=plain, turbo=True)
    assert (turbo.steps, turbo.cfg, turbo.time_shift) == (8, 0.0, TimeShift(fixed=TURBO_MU))
    student = recorded(tmp_path, text_encoder="tiny:3", sampling={"steps": 4, "cfg": 0})
    plan = plan_sample(weights=student)
    assert (plan.steps, plan.cfg) == (4, 0.0) and "4 steps, no CFG" in plan.describe()
    assert plan_sample(weights=student, turbo=True).steps == 4  # its own record wins
    flags = plan_sample(weights=student, steps=2, cfg=1.5)
    assert (flags.steps, flags.cfg) == (2, 1.5)
    (tmp_path / "m").mkdir()
    folder = scheduler_folder(tmp_path / "m", {"use_dynamic_shifting": True},
                              {"is_distilled": True})  # fmt: skip
    (folder / "dit.safetensors").write_bytes(plain.read_bytes())
    assert read_model_folder(folder).distilled
    plan = plan_sample(model=folder)
    assert (plan.steps, plan.cfg, plan.time_shift) == (8, 0.0, TimeShift(fixed=TURBO_MU))


BAD_SAMPLING = [{"steps": 0, "cfg": 0}, {"steps": 4}, "fast", {"steps": 4, "cfg": -1},
                {"steps": True, "cfg": 0}]  # fmt: skip


@pytest.mark.parametrize("sampling", BAD_SAMPLING)
def test_a_malformed_sampling_record_is_refused(tmp_path, sampling):
    with pytest.raises(UserError, match="'sampling' must be"):
        recorded(tmp_path, text_encoder="tiny:3", sampling=sampling)
