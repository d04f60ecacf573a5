"""Turbo as an artifact: a ``tdm`` stage distilled from a release-shaped model folder exports
as a diffusers folder that diffusers' Krea2Pipeline loads and samples exactly as our sampler
does on the student's own grid (steps, no CFG, mu), and that ``krea2 dit sample --model``
and ``krea2 train sample`` sample on that grid by themselves."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from krea2.dit.flow import TURBO_MU, TimeShift
from krea2.dit.testing import write_tiny_model_folder
from krea2.trainer import load_job, load_stage_module
from krea2.trainer.testing import release_job_head

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import launch_module
from tdm_helpers import prompts

from krea2.rl.online import export_prompt_shards

SIDE, STEPS = 32, 2


@pytest.fixture(scope="module")
def turbo(tmp_path_factory) -> Path:
    """A 2-step ``tdm`` student of a tiny release folder, at Turbo's fixed mu 1.15."""
    root = tmp_path_factory.mktemp("turbo")
    release = write_tiny_model_folder(root / "model")
    export_prompt_shards(prompts(8), root / "prompts", SIDE, 4)
    config = root / "job.toml"
    config.write_text(
        release_job_head(root / "run", release, every=0)
        + f"""
[[stages]]
name = "turbo"
objective = "tdm"
data = ["{root / "prompts"}/*.parquet"]
init_from = "{release}"
resolution = {SIDE}
time_shift = {TURBO_MU}
steps = 2
batch_size = 4
lr = 1e-4
[stages.schedule]
warmup_steps = 0
[stages.settings]
student_steps = {STEPS}
teacher_guidance = 3.0
"""
    )
    out, _ = (proc := launch_module(1, "krea2.trainer", "--config", str(config))).communicate(
        timeout=600
    )
    assert proc.returncode == 0, out[-3000:]
    return config


def _pipeline_images(folder: Path, captions: list[str]) -> torch.Tensor:
    from diffusers import Krea2Pipeline

    from krea2.dit.patches import patchify
    from krea2.dit.sampler import seeded_noise

    pipe = Krea2Pipeline.from_pretrained(folder).to(torch.float32)
    noise = seeded_noise([0], (16, SIDE // 4, SIDE // 4), torch.float32, torch.device("cpu"))
    return pipe(
        captions, height=SIDE, width=SIDE, num_inference_steps=STEPS, guidance_scale=0.0,
        latents=patchify(noise, 2), output_type="pt", max_sequence_length=16,
    ).images  # fmt: skip


@pytest.mark.parametrize("mu", [TURBO_MU, 0.9])
def test_the_exported_turbo_samples_in_krea2pipeline_as_in_ours(turbo, tmp_path, mu):
    from krea2.dit.generation import generate
    from krea2.dit.sample_plan import plan_sample
    from krea2.dit.text import TextEncoder
    from krea2.dit.vae import QwenImageVAE
    from krea2.trainer.stage_export import export_stage

    job = load_job(turbo)
    # the same weights recorded at another fixed mu: the folder must carry that grid
    job = replace(job, stages=[replace(job.stages[0], time_shift=mu)])
    folder = export_stage(job, 0, tmp_path / "turbo", "diffusers")
    index = json.loads((folder / "model_index.json").read_text())
    scheduler = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    if mu == TURBO_MU:  # the release's Turbo: marked distilled, dynamic scheduler kept
        assert index["is_distilled"] is True and scheduler["use_dynamic_shifting"] is True
    else:
        assert index["is_distilled"] is False and scheduler["use_dynamic_shifting"] is False
        assert scheduler["shift"] == pytest.approx(math.exp(mu))
    plan = plan_sample(model=folder)  # `krea2 dit sample --model TURBO` picks its grid
    assert (plan.steps, plan.cfg, plan.time_shift) == (STEPS, 0.0, TimeShift(fixed=mu))
    release = job.text.encoder.split(":", 1)[1].rsplit("/", 1)[0]
    module = load_stage_module(job, 0)
    encoder = TextEncoder.from_pretrained(release, max_length=16, dtype=torch.float32)
    ae = QwenImageVAE.from_pretrained(Path(release) / "vae", dtype=torch.float32)
    captions = ["a red circle in the top left cell"]
    with torch.no_grad():
        ours = generate(module.dit, encoder, ae, captions, SIDE, SIDE, steps=plan.steps,
                        cfg=plan.cfg, mu=plan.time_shift)  # fmt: skip
    theirs = _pipeline_images(folder, captions)
    torch.testing.assert_close(theirs, (ours / 2 + 0.5).clamp(0, 1), atol=2e-4, rtol=0)


def test_train_sample_defaults_to_the_students_steps_without_cfg(turbo, tmp_path):
    from krea2.trainer.inference import sample_run

    grid = sample_run(load_job(turbo).run_dir, ["a red circle"], tmp_path / "s")
    info = json.loads((grid.parent / "grid.json").read_text())
    assert (info["steps"], info["cfg"]) == (STEPS, 0.0)
    assert info["conditioning"]["sampling"] == {"steps": STEPS, "cfg": 0.0}
