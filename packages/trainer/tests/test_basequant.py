"""A LoRA stage on an int8 frozen base (torchao weight-only, CPU): the block Linears are
stored in int8, the model's velocity stays close to the fp32 base's, gradients reach the
adapters through the quantized layers, and a run trains; float8 asks for a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_test_helpers import lora_job_toml

from krea2.dit.testing import write_tiny_model_folder
from krea2.infra import UserError
from krea2.trainer.basequant import base_bytes
from krea2.trainer.build import build_module
from krea2.trainer.cli import run_job
from krea2.trainer.config import load_job
from krea2.trainer.distributed import init_distributed
from krea2.trainer.observe import read_metrics
from krea2.trainer.validate import validate_job
from krea2.trainer.warmstart import warm_start


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return write_tiny_model_folder(tmp_path_factory.mktemp("release") / "model")


def _config(tmp_path: Path, release: Path, shards, steps: int = 2) -> Path:
    config = tmp_path / "job.toml"
    config.write_text(lora_job_toml(tmp_path / "run", release, shards, steps))
    return config


def _module(config: Path, *overrides: str):
    job = load_job(config, ["model.init_device=cpu", *overrides])
    module = build_module(job, job.stages[0], init_distributed(job))
    warm_start(job, 0, module, distributed=False)
    return module


def test_an_int8_base_stores_its_blocks_in_under_0_4_of_the_bytes_and_keeps_the_velocity(
    release, shards, tmp_path
):
    config = _config(tmp_path, release, shards)
    plain, quant = _module(config), _module(config, "model.base_quant=int8")
    wq = quant.dit.blocks[0].attn.wq.base_layer.weight
    assert "Int8" in type(wq).__name__ and not wq.requires_grad
    blocks = base_bytes(quant.dit, "blocks."), base_bytes(plain.dit, "blocks.")
    assert blocks[0] < 0.4 * blocks[1], blocks  # int8 weights + fp32 scales vs fp32
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 8, 8, generator=g)
    t, prompts = torch.tensor([0.3, 0.7]), ["a red circle", "a blue square"]
    v_plain, _ = plain(x, t, prompts)
    v_quant, _ = quant(x, t, prompts)
    err = (v_quant - v_plain).norm() / v_plain.norm()
    assert 0 < err < 0.05  # int8 rounding, not another model
    v_quant.square().mean().backward()
    # B of the first block: its gradient passes through every later block's int8 Linears
    b = quant.dit.blocks[0].attn.wq.lora_A["default"].weight
    grads = [p.grad for n, p in quant.dit.named_parameters() if p.requires_grad]
    assert b.requires_grad and all(g is not None for g in grads)
    assert any(g.abs().max() > 0 for g in grads)


def test_a_lora_run_on_an_int8_base_trains(release, shards, tmp_path):
    config = _config(tmp_path, release, shards, steps=3)
    run_job(config, ["model.base_quant=int8", "optimizer.lr=0.05"], resume=False)
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert (tmp_path / "run" / "adapters" / "lora" / "comfyui.safetensors").is_file()


def test_float8_on_a_cpu_is_refused_naming_the_gpu_it_needs(release, shards, tmp_path):
    config = _config(tmp_path, release, shards)
    with pytest.raises(UserError, match=r"float8.*CUDA GPU.*8\.9.*int8"):
        run_job(config, ["model.base_quant=float8"], resume=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_base_quant_needs_a_lora_stage_one_device_and_no_second_base(release, shards, tmp_path):
    config = _config(tmp_path, release, shards)
    job = load_job(config, ["model.base_quant=int8"])
    validate_job(job)
    with pytest.raises(UserError, match="one device only"):
        validate_job(job, world_size=2)
    full = load_job(config, ["model.base_quant=int8", "stages.0.lora.rank=0"])
    with pytest.raises(UserError, match="no stage trains LoRA"):
        validate_job(full)
    second = load_job(config, ["model.base_quant=int8", f"observe.second_base={release}"])
    with pytest.raises(UserError, match="second_base"):
        validate_job(second)
    with pytest.raises(Exception, match="base_quant"):
        load_job(config, ["model.base_quant=int4"])
