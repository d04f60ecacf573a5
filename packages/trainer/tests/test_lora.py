"""LoRA stages on a tiny release-shaped model folder: adapters are all a checkpoint holds,
the base stays the released weights, and a resumed run repeats the uninterrupted one
bit for bit (in process here; 2 gloo ranks killed with SIGKILL in the slow test)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from trainer_test_helpers import held_env, kill_when_held, lora_job_toml, newest_save_at, ranks

from krea2.dit.testing import make_inputs, write_tiny_model_folder
from krea2.dit.weights import read_checkpoint, save_weights
from krea2.infra.errors import UserError
from krea2.trainer.checkpoint_tensors import load_tensors, tensor_keys
from krea2.trainer.cli import run_job
from krea2.trainer.config import load_job
from krea2.trainer.inference import load_stage_module
from krea2.trainer.observe import read_metrics

STEPS = 4


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return write_tiny_model_folder(tmp_path_factory.mktemp("release") / "model")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, release, shards) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lora")
    config = root / "job.toml"
    # a second base for validation: the release's DiT, perturbed
    weights, cfg = read_checkpoint(release / "transformer")
    g = torch.Generator().manual_seed(1)
    other = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in weights.items()}
    second = save_weights(other, root / "second.safetensors", config=cfg)
    # a high learning rate, so 4 steps move the adapters far enough to change images; a
    # sample grid (and the second base's) after step 1 and at the end
    extra = f"""[optimizer]
lr = 0.05
[observe]
sample_prompts = ["a red circle"]
sample_steps = 2
sample_every = 2
second_base = "{second}"
second_base_steps = 2
"""
    config.write_text(lora_job_toml(root / "run", release, shards, STEPS, extra))
    run_job(config, [], resume=False)
    return config, root / "run"


def _step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / "lora" / f"step-{step:09d}"


def _model_tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    meta = tensor_keys(step_dir, "model.")
    return load_tensors(step_dir, sorted(meta), meta)


def _train_rows(run: Path) -> list[tuple]:
    rows = read_metrics(run / "metrics.jsonl")
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if r["kind"] == "train"]


def test_a_lora_checkpoint_holds_only_the_adapters(trained):
    _, run = trained
    keys = sorted(tensor_keys(_step_dir(run, STEPS - 1), "model."))
    # 2 blocks x (wq, wk, wv, gate, wo, gate, up, down) x (A, B)
    assert len(keys) == 2 * 8 * 2
    assert all(".lora_A." in k or ".lora_B." in k for k in keys)
    tensors = _model_tensors(_step_dir(run, STEPS - 1))
    assert (run / "adapters" / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert (run / "adapters" / "lora" / "comfyui.safetensors").is_file()
    # B starts at zero: the adapters did train
    assert tensors["model.dit.blocks.0.attn.wq.lora_B.default.weight"].abs().max() > 0


def test_the_base_stays_the_released_weights(trained, release):
    config, _ = trained
    module = load_stage_module(load_job(config), 0)
    want, _ = read_checkpoint(release / "transformer")
    got = {k.replace(".base_layer.", "."): v for k, v in module.dit.state_dict().items()}
    for key, value in want.items():
        assert torch.equal(got[key], value.to(got[key].dtype)), key


def test_resuming_an_earlier_checkpoint_repeats_the_run_bit_for_bit(trained, tmp_path):
    config, run = trained
    again = tmp_path / "run"
    shutil.copytree(run, again)
    (again / "checkpoints" / "lora.done").unlink()
    shutil.rmtree(_step_dir(again, STEPS - 1))
    rows = [json.loads(x) for x in (again / "metrics.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r.get("kind") != "train" or r["step"] < 2]
    (again / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    run_job(config, [f"run_dir={again}"], resume=True)
    assert _train_rows(again) == _train_rows(run)
    a, b = _model_tensors(_step_dir(run, STEPS - 1)), _model_tensors(_step_dir(again, STEPS - 1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_lora_on_two_fsdp_ranks_resumes_bit_exactly_after_sigkill(release, shards, tmp_path):
    """The frozen base sharded over 2 gloo ranks (meta build, rank 0 reads the release),
    killed mid-run with SIGKILL, resumed: losses, grad norms and adapters equal bit for bit."""
    steps = 8
    runs = {}
    for name in ("straight", "killed"):
        config = tmp_path / f"{name}.toml"
        config.write_text(lora_job_toml(tmp_path / name, release, shards, steps))
        runs[name] = config
    out, _ = (p := ranks(2, runs["straight"])).communicate(timeout=600)
    assert p.returncode == 0, out[-3000:]
    # held after 5 of 8 steps (a pause point: it cannot train on first), killed once its
    # newest checkpoint begun (step 3; checkpoint.every = 2) is complete
    notice, saved = tmp_path / "paused", newest_save_at(5, every=2)
    killed = ranks(2, runs["killed"], env=held_env("lora", 5, notice))
    kill_when_held(killed, notice, tmp_path / "killed" / "checkpoints" / "lora", saved, nranks=2)
    assert max(s for s, *_ in _train_rows(tmp_path / "killed")) == 4
    out, _ = (p := ranks(2, runs["killed"], "--resume")).communicate(timeout=600)
    assert p.returncode == 0, out[-3000:]
    assert f"resumed stage lora at step {saved + 1}" in out
    assert _train_rows(tmp_path / "killed") == _train_rows(tmp_path / "straight")
    a = _model_tensors(_step_dir(tmp_path / "straight", steps - 1))
    b = _model_tensors(_step_dir(tmp_path / "killed", steps - 1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert FileSystemReader(_step_dir(tmp_path / "killed", steps - 1)).read_metadata()


def _pipeline(release: Path):
    """diffusers' Krea2Pipeline from the tiny folder's parts, in float32."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        Krea2Pipeline,
        Krea2Transformer2DModel,
    )
    from transformers import AutoTokenizer, Qwen3VLModel

    return Krea2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(release / "scheduler"),
        vae=AutoencoderKLQwenImage.from_pretrained(release / "vae"),
        text_encoder=Qwen3VLModel.from_pretrained(release / "text_encoder"),
        tokenizer=AutoTokenizer.from_pretrained(release / "tokenizer"),
        transformer=Krea2Transformer2DModel.from_pretrained(release / "transformer"),
    ).to(torch.float32)


def test_the_diffusers_adapter_in_krea2pipeline_gives_our_sampler_s_images(
    trained, release, tmp_path
):
    """diffusers' Krea2Pipeline with the exported adapter (load_lora_weights) against our
    sampler on the trained module (peft layers, alpha/rank 2): same noise, prompt, steps,
    CFG and resolution shift; images equal to float tolerance."""
    from krea2.dit.generation import generate
    from krea2.dit.patches import patchify
    from krea2.dit.sampler import seeded_noise
    from krea2.dit.text import TextEncoder
    from krea2.dit.vae import QwenImageVAE
    from krea2.trainer.adapters import export_adapter

    config, run = trained
    job = load_job(config)
    adapter = export_adapter(job, 0, _step_dir(run, STEPS - 1), tmp_path / "lora", "diffusers")
    module = load_stage_module(job, 0)
    encoder = TextEncoder.from_pretrained(release, max_length=16, dtype=torch.float32)
    ae = QwenImageVAE.from_pretrained(release / "vae", dtype=torch.float32)
    prompts, side, steps, cfg = ["a red circle in the top left cell"], 32, 3, 2.0
    with torch.no_grad():
        ours = generate(module.dit, encoder, ae, prompts, side, side, steps=steps, cfg=cfg)
    pipe = _pipeline(release)
    pipe.load_lora_weights(adapter.parent, weight_name=adapter.name)
    noise = seeded_noise([0], (16, side // 4, side // 4), torch.float32, torch.device("cpu"))
    theirs = pipe(
        prompts,
        height=side,
        width=side,
        num_inference_steps=steps,
        guidance_scale=cfg,
        latents=patchify(noise, 2),
        output_type="pt",
        max_sequence_length=16,
    ).images
    torch.testing.assert_close(theirs, (ours / 2 + 0.5).clamp(0, 1), atol=2e-4, rtol=0)
    pipe.unload_lora_weights()
    base = pipe(
        prompts, height=side, width=side, num_inference_steps=steps, guidance_scale=cfg,
        latents=patchify(noise, 2), output_type="pt", max_sequence_length=16,
    ).images  # fmt: skip
    assert (base - theirs).abs().max() > 1e-2  # the adapter changes the images


def test_the_comfyui_layout_names_released_modules_with_their_alpha(trained, tmp_path):
    from safetensors.torch import load_file

    from krea2.trainer.adapters import export_adapter

    config, run = trained
    out = export_adapter(
        load_job(config), 0, _step_dir(run, STEPS - 1), tmp_path / "c.safetensors", "comfyui"
    )
    sd = load_file(out)
    assert sd["diffusion_model.blocks.1.mlp.down.alpha"].item() == 8.0
    assert sd["diffusion_model.blocks.1.mlp.down.lora_A.weight"].shape == (4, 64)
    assert sd["diffusion_model.blocks.1.mlp.down.lora_B.weight"].shape == (32, 4)
    assert len(sd) == 16 * 3


@pytest.mark.parametrize("fmt", ["krea-merged", "diffusers-merged"])
def test_a_merged_adapter_gives_the_adapted_model_s_velocity(trained, tmp_path, fmt):
    from krea2.dit.testing import make_inputs
    from krea2.dit.weights import from_pretrained
    from krea2.trainer.adapters import export_adapter

    config, run = trained
    job = load_job(config)
    name = "m.safetensors" if fmt == "krea-merged" else "m"
    out = export_adapter(job, 0, _step_dir(run, STEPS - 1), tmp_path / name, fmt)
    merged = from_pretrained(out, dtype=torch.float32)
    adapted = load_stage_module(job, 0).dit
    img, txt, t, pos, mask = make_inputs(merged.cfg)
    with torch.no_grad():
        want, got = adapted(img, txt, t, pos, mask), merged(img, txt, t, pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_released_weights_of_another_shape_are_refused_naming_the_fields(release, shards, tmp_path):
    from krea2.infra.errors import UserError
    from krea2.trainer.build import build_module
    from krea2.trainer.distributed import init_distributed
    from krea2.trainer.warmstart import warm_start

    config = tmp_path / "job.toml"
    config.write_text(lora_job_toml(tmp_path / "run", release, shards, 2))
    job = load_job(config, ["model.overrides.depth=3", "model.overrides.width=64"])
    module = build_module(job, job.stages[0], init_distributed(job))
    with pytest.raises(UserError, match=r"width 32 \(config: 64\), depth 2 \(config: 3\)"):
        warm_start(job, 0, module, distributed=False)


@pytest.mark.parametrize("where", ["native", "transformer"])
def test_native_and_diffusers_releases_load_the_same_weights(release, shards, tmp_path, where):
    """A full fine-tuning stage (no LoRA) from a native release file or a diffusers
    transformer folder starts at the same tensors as the diffusers model folder."""
    from krea2.trainer.build import build_module
    from krea2.trainer.distributed import init_distributed
    from krea2.trainer.warmstart import warm_start

    want, cfg = read_checkpoint(release / "transformer")
    source = release / "transformer"
    if where == "native":
        source = save_weights(want, tmp_path / "krea2-tiny.safetensors", config=cfg)
    config = tmp_path / "job.toml"
    config.write_text(lora_job_toml(tmp_path / "run", release, shards, 2))
    job = load_job(config, ["stages.0.lora.rank=0", f"stages.0.init_from={source}"])
    module = build_module(job, job.stages[0], init_distributed(job))
    warm_start(job, 0, module, distributed=False)
    got = module.dit.state_dict()
    assert all(torch.equal(got[k], v.to(got[k].dtype)) for k, v in want.items())


def test_export_lora_writes_what_the_stage_end_wrote(trained, tmp_path):
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from krea2.trainer.cli import app

    _, run = trained
    out = tmp_path / "c.safetensors"
    args = ["export-lora", str(run), "--format", "comfyui", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    want = load_file(run / "adapters" / "lora" / "comfyui.safetensors")
    got = load_file(out)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.parametrize(
    ("fmt", "out", "message"),
    [
        ("diffusers", "my_lora.safetensors", "writes a folder, but --out .* names a file"),
        ("comfyui", "comfy_out", "writes one .safetensors file, but --out .* is not one"),
        ("comfyui", "existing_dir", "e.g. --out .*existing_dir/lora.safetensors"),
        ("krea-merged", "taken.safetensors", "exists; pass --force"),
        ("diffusers", "full_dir", "exists; pass --force"),
    ],
)
def test_export_lora_refuses_the_wrong_kind_of_out_and_never_overwrites(
    trained, tmp_path, fmt, out, message
):
    from typer.testing import CliRunner

    from krea2.trainer.cli import app

    _, run = trained
    (tmp_path / "existing_dir").mkdir()
    (tmp_path / "taken.safetensors").write_bytes(b"mine")
    (tmp_path / "full_dir").mkdir()
    (tmp_path / "full_dir" / "notes.txt").write_text("mine")
    args = ["export-lora", str(run), "--format", fmt, "--out", str(tmp_path / out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and isinstance(result.exception, UserError)
    assert re.search(message, str(result.exception)), result.exception
    assert (tmp_path / "taken.safetensors").read_bytes() == b"mine"  # nothing replaced
    assert (tmp_path / "full_dir" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "my_lora.safetensors").exists()
    forced = CliRunner().invoke(app, [*args, "--force"])
    assert (forced.exit_code == 0) == (out in ("taken.safetensors", "full_dir")), forced.output


def test_validation_grids_reach_the_run_dir_and_tensorboard(trained):
    """The prompt x seed grid every 2 steps, also with the adapter on the second base
    (which gives other images), in samples/ and in the TensorBoard events with the
    scalars and the config."""
    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run = trained
    for step in (1, STEPS - 1):
        main = np.asarray(Image.open(run / "samples" / f"lora-{step:06d}.png"))
        second = np.asarray(Image.open(run / "samples" / f"lora-{step:06d}-second-base.png"))
        assert main.shape == second.shape and not np.array_equal(main, second)
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0}).Reload()
    assert [e.step for e in acc.Scalars("lora/train/loss")] == list(range(STEPS))
    assert [e.step for e in acc.Images("lora/samples/grid")] == [1, STEPS - 1]
    assert [e.step for e in acc.Images("lora/samples_second_base/second_base")] == [1, STEPS - 1]
    assert "config" in acc.Tags()["tensors"]


def test_on_one_device_a_bf16_base_keeps_fp32_adapters_that_learn(release, shards, tmp_path):
    from krea2.trainer.build import build_module
    from krea2.trainer.distributed import init_distributed

    config = tmp_path / "job.toml"
    config.write_text(lora_job_toml(tmp_path / "run", release, shards, 2))
    job = load_job(config, ["model.dtype=bfloat16", "model.init_device=cpu"])
    module = build_module(job, job.stages[0], init_distributed(job))
    dtypes = {n: p.dtype for n, p in module.dit.named_parameters()}
    assert dtypes["blocks.0.attn.wq.base_layer.weight"] == torch.bfloat16
    assert dtypes["blocks.0.attn.wq.lora_A.default.weight"] == torch.float32
    x = torch.randn(2, 16, 8, 8, dtype=torch.bfloat16)
    v, _ = module(x, torch.tensor([0.3, 0.7]), ["a red circle", "a blue square"])
    v.float().square().mean().backward()
    grad = module.dit.blocks[0].attn.wq.lora_B["default"].weight.grad
    assert grad is not None and grad.dtype == torch.float32 and grad.abs().max() > 0


def _after_lora(config: Path, run: Path, lora: bool) -> object:
    """The trained job with one more stage that starts from the LoRA stage (init_from
    previous): full fine-tuning, or LoRA again."""
    from dataclasses import replace

    from krea2.trainer.config import LoraConfig

    job = load_job(config)
    job.run_dir = run
    base = job.stages[0]
    after = replace(base, name="after", init_from="previous",
                    lora=base.lora if lora else LoraConfig())  # fmt: skip
    return replace(job, stages=[base, after])


def test_a_stage_after_a_lora_stage_starts_from_its_merged_result(trained):
    from krea2.dit.testing import make_inputs
    from krea2.trainer.build import build_module
    from krea2.trainer.distributed import init_distributed
    from krea2.trainer.warmstart import warm_start

    config, run = trained
    job = _after_lora(config, run, lora=False)
    module = build_module(job, job.stages[1], init_distributed(job))
    warm_start(job, 1, module, False)
    adapted = load_stage_module(load_job(config), 0).dit
    img, txt, t, pos, mask = make_inputs(adapted.cfg)
    with torch.no_grad():
        want, got = adapted(img, txt, t, pos, mask), module.dit.eval()(img, txt, t, pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_lora_stage_after_a_lora_stage_exports_onto_the_merged_base(trained, tmp_path):
    from krea2.trainer.adapters import base_weights, export_adapter

    config, run = trained
    out = export_adapter(
        load_job(config), 0, _step_dir(run, STEPS - 1), tmp_path / "m.safetensors", "krea-merged"
    )
    merged = read_checkpoint(out)[0]
    base = base_weights(_after_lora(config, run, lora=True), 1, None)
    assert sorted(base) == sorted(merged)
    for key, value in merged.items():
        torch.testing.assert_close(base[key], value, atol=1e-6, rtol=1e-6)


def test_adopted_weights_are_a_finished_stage_that_loads_and_continues(trained, tmp_path):
    from krea2.dit.testing import make_inputs
    from krea2.dit.weights import from_pretrained
    from krea2.trainer.adapters import export_adapter
    from krea2.trainer.continuation import adopt_weights, continuation_job

    config, run = trained
    source = load_job(config)
    merged = export_adapter(
        source, 0, _step_dir(run, STEPS - 1), tmp_path / "m.safetensors", "krea-merged"
    )
    job = adopt_weights(source, 0, "sft", merged, tmp_path / "adopted")
    assert [s.name for s in job.stages] == ["lora", "sft"]
    assert (tmp_path / "adopted" / "checkpoints" / "sft.done").exists()
    want_model = from_pretrained(merged, dtype=torch.float32)
    got_model = load_stage_module(job, 1).dit
    img, txt, t, pos, mask = make_inputs(want_model.cfg)
    with torch.no_grad():
        want, got = want_model(img, txt, t, pos, mask), got_model(img, txt, t, pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert adopt_weights(source, 0, "sft", merged, tmp_path / "adopted") == job  # idempotent
    from dataclasses import replace

    after = continuation_job(job, 1, replace(job.stages[1], name="po"), tmp_path / "po")
    assert [s.name for s in after.stages] == ["lora", "sft", "po"]
    assert after.stages[-1].init_from == "previous"


def test_a_stage_exports_as_a_pipeline_folder_that_reproduces_our_sampler(trained, tmp_path):
    """`krea2 train export --layout diffusers`: Krea2Pipeline.from_pretrained(folder) gives
    our sampler's images of the stage (the LoRA merged); --layout release reads back as the
    same DiT with its conditioning record."""
    from diffusers import Krea2Pipeline

    from krea2.dit.generation import generate
    from krea2.dit.patches import patchify
    from krea2.dit.sampler import seeded_noise
    from krea2.dit.text import TextEncoder
    from krea2.dit.vae import QwenImageVAE
    from krea2.dit.weights import from_pretrained, read_conditioning
    from krea2.trainer.stage_export import export_stage

    config, _ = trained
    job = load_job(config)
    folder = export_stage(job, 0, tmp_path / "raw", "diffusers")
    release = job.text.encoder.split(":", 1)[1].rsplit("/", 1)[0]
    module = load_stage_module(job, 0)
    encoder = TextEncoder.from_pretrained(release, max_length=16, dtype=torch.float32)
    ae = QwenImageVAE.from_pretrained(Path(release) / "vae", dtype=torch.float32)
    prompts, side, steps, cfg = ["a red circle in the top left cell"], 32, 3, 2.0
    with torch.no_grad():
        ours = generate(module.dit, encoder, ae, prompts, side, side, steps=steps, cfg=cfg)
    pipe = Krea2Pipeline.from_pretrained(folder).to(torch.float32)
    noise = seeded_noise([0], (16, side // 4, side // 4), torch.float32, torch.device("cpu"))
    theirs = pipe(
        prompts, height=side, width=side, num_inference_steps=steps, guidance_scale=cfg,
        latents=patchify(noise, 2), output_type="pt", max_sequence_length=16,
    ).images  # fmt: skip
    torch.testing.assert_close(theirs, (ours / 2 + 0.5).clamp(0, 1), atol=2e-4, rtol=0)
    single = export_stage(job, 0, tmp_path / "raw.safetensors", "release")
    assert read_conditioning(single)["text_tokens"] == 16
    img, txt, t, pos, mask = make_inputs(module.dit.cfg)
    with torch.no_grad():
        want = module.dit(img, txt, t, pos, mask)
        got = from_pretrained(single, dtype=torch.float32)(img, txt, t, pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(UserError, match="exists; pass --force"):
        export_stage(job, 0, single, "release")
