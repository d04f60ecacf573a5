"""Performance switches and iREPA: activation checkpointing, compile, float8, iREPA on/off."""

from __future__ import annotations

import torch

from krea2.infra.config import load_config
from krea2.trainer.build import build_module
from krea2.trainer.cli import run_job
from krea2.trainer.config import CheckpointingMode, Float8Recipe, JobConfig
from krea2.trainer.distributed import init_distributed
from krea2.trainer.observe import read_metrics


def _module(job, **stage):
    cfg = load_config(JobConfig, job)
    for k, v in stage.items():
        setattr(cfg.stages[0], k, v)
    return build_module(cfg, cfg.stages[0], init_distributed(cfg))


def _step(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, 32, 32, generator=g)
    t = torch.rand(4, generator=g)
    v, _ = module(x, t, ["a red disc", "a blue square", "", "green"])
    return v.square().mean()


def _saved_bytes(module) -> int:
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = _step(module)
    loss.backward()
    return total


def _flops(module) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        _step(module).backward()
    return counter.get_total_flops()


def test_activation_checkpointing_trades_saved_activations_for_recompute(write_job):
    job = write_job()
    none, sel, full = CheckpointingMode.NONE, CheckpointingMode.SELECTIVE, CheckpointingMode.FULL
    saved = {m: _saved_bytes(_module(job, checkpointing=m)) for m in (none, sel, full)}
    flops = {m: _flops(_module(job, checkpointing=m)) for m in (none, sel, full)}
    # Both modes keep only block inputs for autograd (selective keeps matmul outputs inside
    # the checkpoint); full recomputes every block matmul in backward, selective none.
    assert saved[full] < saved[none] / 2 and saved[sel] < saved[none] / 2
    assert flops[full] > 1.2 * flops[none]
    assert flops[sel] == flops[none]


def test_checkpointing_does_not_change_gradients(write_job):
    job = write_job()
    grads = []
    for mode in (CheckpointingMode.NONE, CheckpointingMode.FULL):
        m = _module(job, checkpointing=mode)
        _step(m).backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_compiled_blocks_match_eager(write_job):
    job = write_job()
    eager = _step(_module(job))
    compiled = _step(_module(job, compile=True, compile_backend="aot_eager"))
    assert torch.allclose(eager, compiled, rtol=1e-5)


def test_float8_emulation_converts_block_linears_and_stays_close(write_job):
    job = write_job()
    from torchao.float8.float8_linear import Float8Linear

    m8 = _module(job, float8=Float8Recipe.TENSORWISE, float8_emulate=True)
    converted = [n for n, mod in m8.named_modules() if isinstance(mod, Float8Linear)]
    assert "dit.blocks.0.attn.wq" in converted
    assert not any(n.startswith(("dit.first", "dit.last", "dit.tmlp")) for n in converted)
    ref, loss8 = _step(_module(job)), _step(m8)
    loss8.backward()
    assert torch.isfinite(loss8) and abs(loss8.item() / ref.item() - 1) < 0.1
    # Same state-dict keys as the high-precision model (fp8 stays a training-time swap).
    assert set(m8.state_dict()) == set(_module(job).state_dict())


def test_irepa_aligns_then_switches_off_and_is_not_exported(write_job, tmp_path):
    extra = "[stages.irepa]\nsteps = 10\nlayer = 0\nweight = 1.0\n"
    job = write_job("irepa", steps=14)
    job.write_text(job.read_text() + extra)
    run_job(job, [], resume=False)
    rows = [r for r in read_metrics(tmp_path / "irepa" / "metrics.jsonl") if r["kind"] == "train"]
    on = [r["irepa_loss"] for r in rows if r["step"] < 10]
    assert len(on) == 10 and all(0 <= x <= 2 for x in on)
    assert sum(on[-3:]) / 3 < 0.9 * on[0]  # the projected block aligns to the encoder
    assert all("irepa_loss" not in r for r in rows if r["step"] >= 10)
    from krea2.trainer.merge import pma_from_run

    out = tmp_path / "pma.safetensors"
    pma_from_run(tmp_path / "irepa", "pretrain", 2, 0, out)
    from safetensors import safe_open

    with safe_open(str(out), "pt") as f:
        keys = list(f.keys())
    assert keys and not any("irepa" in k or k.startswith("text.") for k in keys)


def test_meta_init_materialises_every_parameter_and_trains(write_job):
    cfg = load_config(JobConfig, write_job(), ["model.init_device=meta"])
    module = build_module(cfg, cfg.stages[0], init_distributed(cfg))
    params = list(module.parameters())
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in params)
    assert any(p.abs().sum() > 0 for p in module.dit.blocks[0].attn.wq.parameters())
    loss = _step(module)
    loss.backward()
    assert torch.isfinite(loss)


def test_bf16_autocast_keeps_fp32_outputs_and_gradients_close(write_job):
    job = write_job()
    ref_module = _module(job)
    ref = _step(ref_module)
    ref.backward()
    cfg = load_config(JobConfig, job, ["model.autocast=bfloat16"])
    module = build_module(cfg, cfg.stages[0], init_distributed(cfg))
    assert module.autocast == torch.bfloat16
    loss = _step(module)
    loss.backward()
    # Master weights, outputs and gradients stay fp32; bf16 only inside the matmuls.
    assert loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in module.parameters())
    assert abs(loss.item() / ref.item() - 1) < 0.02
    g = torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None])
    g_ref = torch.cat([p.grad.flatten() for p in ref_module.parameters() if p.grad is not None])
    assert g.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(g, g_ref, dim=0) > 0.99


def test_autocast_modes_resolve_per_layout_and_reject_unknown(write_job):
    import pytest

    from krea2.infra.config import ConfigError
    from krea2.trainer.build import autocast_dtype
    from krea2.trainer.config import Autocast
    from krea2.trainer.distributed import cpu_has_fast_bf16

    env = init_distributed(load_config(JobConfig, write_job()))
    assert autocast_dtype(Autocast.NONE, env) is None
    assert autocast_dtype(Autocast.BFLOAT16, env) is torch.bfloat16
    # Which CPUs count as fast: test_auto_autocast_takes_bf16_on_cpus_with_fast_bf16.
    want = torch.bfloat16 if cpu_has_fast_bf16() else None
    assert autocast_dtype(Autocast.AUTO, env) is want
    with pytest.raises(ConfigError, match=r"model.autocast.*'none', 'bfloat16', 'auto'"):
        load_config(JobConfig, write_job("bad"), ["model.autocast=fp16"])


def test_x0_prediction_turns_the_dit_output_into_a_velocity(write_job):
    import pytest

    from krea2.infra.config import ConfigError

    cfg = load_config(JobConfig, write_job(), ["model.prediction=x0", "model.x0_min_t=0.1"])
    module = build_module(cfg, cfg.stages[0], init_distributed(cfg))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 32, 32, generator=g)
    t = torch.tensor([0.02, 0.5, 0.9])
    captions = ["a red disc", "a blue square", ""]
    with torch.no_grad():
        v, _ = module(x, t, captions)
        txt, mask = module.text(captions)
        x0 = module.dit.velocity(x, txt, t, mask)  # the raw DiT output, read as x0
    # v = (x_t - x0) / max(t, 0.1): one Euler step to t = 0 lands on the predicted x0.
    tt = t.clamp_min(0.1).view(-1, 1, 1, 1)
    torch.testing.assert_close(v, (x - x0) / tt)
    torch.testing.assert_close(x[1:] - t[1:].view(-1, 1, 1, 1) * v[1:], x0[1:])
    with pytest.raises(ConfigError, match=r"model.prediction.*'velocity', 'x0', 'split'"):
        load_config(JobConfig, write_job("bad"), ["model.prediction=eps"])


def test_split_prediction_is_velocity_for_block_means_and_x0_for_the_detail(write_job):
    import torch.nn.functional as F

    from krea2.trainer.build import parameterization

    cfg = load_config(JobConfig, write_job(), ["model.prediction=split"])
    # the model's own patch: plain velocity
    assert parameterization(cfg, cfg.stages[0]).detail == 1
    cfg.stages[0].patch = 8  # twice the toy's patch 4
    assert parameterization(cfg, cfg.stages[0]).detail == 2
    module = build_module(cfg, cfg.stages[0], init_distributed(cfg))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 16, generator=g)
    t = torch.tensor([0.3, 0.7])
    coarse_v = F.interpolate(torch.randn(2, 3, 8, 8, generator=g), scale_factor=2)
    v = module.output.velocity(coarse_v, x, t)  # a DiT output without detail: x0 detail = 0
    mean = F.interpolate(F.avg_pool2d(x, 2), scale_factor=2)
    torch.testing.assert_close(v, coarse_v + (x - mean) / t.view(-1, 1, 1, 1))
    # The true velocity is reproduced exactly by the output (v's block means, x0's detail).
    x0, eps = torch.randn(2, 3, 16, 16, generator=g), torch.randn(2, 3, 16, 16, generator=g)
    tt = t.view(-1, 1, 1, 1)
    x_t = (1 - tt) * x0 + tt * eps
    true_v = eps - x0
    vmean = F.interpolate(F.avg_pool2d(true_v, 2), scale_factor=2)
    x0_detail = x0 - F.interpolate(F.avg_pool2d(x0, 2), scale_factor=2)
    torch.testing.assert_close(module.output.velocity(vmean + x0_detail, x_t, t), true_v)


def test_auto_autocast_takes_bf16_on_cpus_with_fast_bf16(monkeypatch, write_job):
    from krea2.trainer import build, distributed
    from krea2.trainer.config import Autocast

    env = init_distributed(load_config(JobConfig, write_job()))
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    for vendor, flags, want in (
        ("AuthenticAMD", {"avx2"}, None),
        ("GenuineIntel", {"avx512f", "avx512_bf16"}, None),  # slower than fp32 without AMX
        ("GenuineIntel", {"avx512_bf16", "amx_tile", "amx_bf16"}, torch.bfloat16),
        ("AuthenticAMD", {"avx512f", "avx512_bf16"}, torch.bfloat16),  # Zen 4: 1.5-2x
    ):
        monkeypatch.setattr(distributed, "cpu_flags", lambda f=flags: frozenset(f))
        monkeypatch.setattr(distributed, "cpu_vendor", lambda v=vendor: v)
        assert build.autocast_dtype(Autocast.AUTO, env) is want, (vendor, flags)
