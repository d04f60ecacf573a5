"""Config errors fail before any work starts, with one clear message."""

from __future__ import annotations

import subprocess
import sys

import pytest

from krea2.infra.config import ConfigError
from krea2.infra.errors import UserError
from krea2.trainer.config import JobConfig, StageConfig, load_job
from krea2.trainer.validate import validate_job


def test_unknown_optimizer_names_the_choices(write_job):
    with pytest.raises(ConfigError, match=r"optimizer.name.*'adamw', 'muon'"):
        load_job(write_job(), ["optimizer.name=sgdx"])


def test_tp_degree_not_dividing_heads_is_rejected(write_job):
    cfg = load_job(write_job(), ["parallel.tp=3"])
    with pytest.raises(UserError, match=r"tensor-parallel degree 3 does not divide heads=4"):
        validate_job(cfg, world_size=3)


def test_mesh_must_cover_the_world(write_job):
    cfg = load_job(write_job(), ["parallel.dp=2", "parallel.tp=2"])
    with pytest.raises(UserError, match=r"= 4 ranks, but the job has 2"):
        validate_job(cfg, world_size=2)


def test_stage_without_data_is_rejected(tmp_path):
    cfg = JobConfig(run_dir=tmp_path / "r", stages=[StageConfig(name="a")])
    with pytest.raises(UserError, match=r"stage 'a' has no data"):
        validate_job(cfg)


def test_missing_shard_path_is_named(write_job, tmp_path):
    cfg = load_job(write_job(), [f"stages.0.data=['{tmp_path}/nope/*.parquet']"])
    with pytest.raises(UserError, match=r"match no Parquet files"):
        validate_job(cfg)


def test_float8_without_a_capable_gpu_is_rejected_not_ignored(write_job):
    cfg = load_job(write_job(), ["stages.0.float8=tensorwise"])
    with pytest.raises(UserError, match=r"float8='tensorwise' needs an NVIDIA GPU"):
        validate_job(cfg)


def test_batch_must_split_over_dp(write_job):
    cfg = load_job(write_job(), ["stages.0.batch_size=9"])
    with pytest.raises(UserError, match=r"batch_size=9 is not divisible by the 2"):
        validate_job(cfg, world_size=2)


def test_bad_caption_format_is_rejected(write_job):
    with pytest.raises(ConfigError, match=r"caption format 'poem'"):
        load_job(write_job(), ["stages.0.caption_weights={poem = 1.0}"])


def test_cli_config_error_is_one_line_and_does_no_work(write_job, tmp_path):
    job = write_job(run_dir=tmp_path / "never")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "krea2.trainer",
            "--config",
            str(job),
            "--set",
            "optimizer.name=lion",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "lion" in lines[0]
    assert not (tmp_path / "never").exists()


def test_stage_override_out_of_range_is_named(write_job):
    with pytest.raises(ConfigError, match=r"'stages.3' needs an index below 1"):
        load_job(write_job(), ["stages.3.steps=5"])


def test_stage_override_sets_the_field(write_job):
    cfg = load_job(write_job(), ["stages.0.steps=7", "stages.0.schedule.warmup_steps=1"])
    assert cfg.stages[0].steps == 7 and cfg.stages[0].schedule.warmup_steps == 1


def test_enum_settings_are_parsed_once_when_the_config_is_loaded(write_job):
    from krea2.trainer.config import Autocast, Backend, InitDevice, ParamDtype, Prediction

    cfg = load_job(
        write_job(),
        [
            "model.prediction=split",
            "model.autocast=auto",
            "model.dtype=bfloat16",
            "model.init_device=meta",
            "parallel.backend=gloo",
        ],
    )
    assert cfg.model.prediction is Prediction.SPLIT and cfg.model.autocast is Autocast.AUTO
    assert cfg.model.dtype is ParamDtype.BFLOAT16 and cfg.model.init_device is InitDevice.META
    assert cfg.parallel.backend is Backend.GLOO


@pytest.mark.parametrize(
    ("override", "choices"),
    [
        ("model.prediction=eps", r"'velocity', 'x0', 'split'"),
        ("model.autocast=fp16", r"'none', 'bfloat16', 'auto'"),
        ("model.dtype=float16", r"'float32', 'bfloat16'"),
        ("model.init_device=gpu", r"'auto', 'cpu', 'meta'"),
        ("parallel.backend=mpi", r"'auto', 'gloo', 'nccl'"),
    ],
)
def test_bad_enum_value_names_the_key_and_the_choices(write_job, override, choices):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}.*{choices}"):
        load_job(write_job(), [override])


def test_configs_built_in_code_may_pass_enum_strings():
    from krea2.trainer.config import Autocast, ModelConfig, Prediction

    model = ModelConfig(autocast="auto", prediction="x0")
    assert model.autocast is Autocast.AUTO and model.prediction is Prediction.X0
    with pytest.raises(ValueError, match=r"prediction='xo'.*did you mean 'x0'"):
        ModelConfig(prediction="xo")


def test_a_misspelt_model_override_is_one_line_naming_the_key_and_the_closest_field(
    write_job, tmp_path
):
    job = tmp_path / "typo.toml"
    job.write_text(write_job().read_text().replace("width = 64", "widht = 64"))
    proc = subprocess.run(
        [sys.executable, "-m", "krea2.trainer", "--config", str(job), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "overrides.widht is not a DiT config field; did you mean 'width'?" in lines[0]
    assert "typo.toml" in lines[0]


def test_a_model_override_of_the_wrong_type_names_the_key(write_job):
    with pytest.raises(ConfigError, match=r"overrides.depth = '2' must be a whole number"):
        load_job(write_job(), ["model.overrides.depth='2'"])


def test_the_attention_kernel_is_one_of_the_dits_and_reaches_every_attention(write_job):
    from krea2.dit.attention import Attention
    from krea2.trainer.build import build_module
    from krea2.trainer.distributed import init_distributed

    with pytest.raises(ConfigError, match=r"model.attention = 'sdpa'.*auto, cudnn, flash"):
        load_job(write_job(), ["model.attention=sdpa"])
    job = load_job(write_job(), ["model.attention=math"])
    module = build_module(job, job.stages[0], init_distributed(job))
    kernels = {m.backend for m in module.dit.modules() if isinstance(m, Attention)}
    assert kernels == {"math"}
