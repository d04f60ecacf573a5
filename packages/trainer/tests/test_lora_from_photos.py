"""A first LoRA from one's own photos (issue #39): the shipped jobs run as written, the DiT's
shape comes from the model folder, and ``--dry-run`` names every mismatch the run would
meet (batch vs the shards' packing, text taps, latent channels, resolution vs the shards'
side), one ``error:`` line each, before any run directory exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from krea2.dit.testing import write_tiny_model_folder
from krea2.infra.checkpoint import steps_to_delete
from krea2.infra.errors import UserError
from krea2.infra.shards import write_shard
from krea2.trainer.cli import app, run_job
from krea2.trainer.config import load_job
from krea2.trainer.model_shape import dit_config
from krea2.trainer.preflight import preflight
from krea2.trainer.testing import toy_rows, write_toy_shards

REPO = Path(__file__).resolve().parents[3]
TINY_JOB = REPO / "configs" / "lora" / "tiny.toml"
RELEASE_JOB = REPO / "configs" / "lora" / "krea2-12b.toml"
KREA2 = str(Path(sys.executable).parent / "krea2")

# The LoRA job of docs/trainer.md before issue #39, pointed at the tiny model folder.
DOCS_JOB = """
[model]
name = "krea2-12b"
autoencoder = "qwen-image:tiny-model/vae"
init_device = "meta"
[text]
encoder = "qwen3-vl:tiny-model/text_encoder"
[[stages]]
name = "lora"
data = ["shards/mine/*.parquet"]
resolution = 1024
steps = 2000
batch_size = 8
init_from = "tiny-model"
[stages.lora]
rank = 64
alpha = 64
"""


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return write_tiny_model_folder(tmp_path_factory.mktemp("release") / "tiny-model")


def photo_shards(directory: Path, sizes: list[tuple[int, int]], packed: int = 1) -> Path:
    """Shards like ``krea2 train prepare`` writes for a dozen photos: 3 rows of each bucket
    in ``sizes``, interleaved, packed in runs of ``packed``."""
    rows = [r for i, s in enumerate(sizes) for r in toy_rows(3, *s, seed=i, prefix=f"b{i}-")]
    rows = rows[0::3] + rows[1::3] + rows[2::3]
    write_shard(rows, directory / "shard-00000.parquet", stage="user", seed=0, batch_size=packed)
    return directory


@pytest.fixture
def workdir(tmp_path, model_folder, monkeypatch) -> Path:
    """A folder like the user's: tiny-model/ and configs/, shards/ still to be written."""
    (tmp_path / "tiny-model").symlink_to(model_folder)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_the_tiny_lora_job_trains_and_its_adapter_loads_in_krea2pipeline(workdir):
    from diffusers import Krea2Pipeline

    write_toy_shards(workdir / "shards" / "mine-64", 6, size=(64, 64), files=1, batch_size=1)
    fast = ["stages.0.steps=3", "optimizer.lr=0.05", "stages.0.schedule.warmup_steps=1"]
    run_job(Path("configs/lora/tiny.toml"), fast, resume=False)
    run = workdir / "runs" / "lora-tiny"
    assert (run / "adapters" / "lora" / "pytorch_lora_weights.safetensors").is_file()
    out = CliRunner().invoke(
        app, ["export-lora", str(run), "--format", "diffusers", "--out", "lora-tiny"]
    )
    assert out.exit_code == 0, out.output
    pipe = Krea2Pipeline.from_pretrained("tiny-model")
    kwargs = dict(height=64, width=64, num_inference_steps=2, output_type="pt")

    def draw():
        g = torch.Generator().manual_seed(0)
        return pipe("blob 3 in cell 4", generator=g, max_sequence_length=32, **kwargs).images

    base = draw()
    pipe.load_lora_weights("lora-tiny")
    assert (draw() - base).abs().max() > 1e-3  # the adapter is applied


def test_a_model_folder_as_init_from_sets_the_dit_shape_without_overrides(workdir):
    cfg = dit_config(load_job(TINY_JOB))
    assert (cfg.width, cfg.text_taps, cfg.text_dim, cfg.latent_channels) == (32, 12, 16, 16)
    narrower = dit_config(load_job(TINY_JOB, ["model.overrides.depth=1"]))
    assert narrower.depth == 1 and narrower.width == 32  # overrides still apply on top


def test_the_old_docs_job_gets_one_line_per_mismatch_and_no_run_directory(workdir):
    photo_shards(workdir / "shards" / "mine", [(88, 48), (64, 64), (56, 72), (72, 56)])
    (workdir / "job.toml").write_text(DOCS_JOB)
    done = subprocess.run(
        [KREA2, "train", "--config", "job.toml", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert all(line.startswith("error: ") for line in lines), done.stderr
    text = "\n".join(lines)
    expected = [
        r"gives 12 taps x 16 .* text_taps=12, text_dim=2560; set \[model.overrides\]",
        r"init_from tiny-model holds a DiT that does not fit model 'krea2-12b': it has width "
        r"32 \(config: 6144\).* Leave model.name and the shape overrides out",
        r"stages.0.batch_size=8, but the 12 rows .* set stages.0.batch_size = 1",
        r"stages.0.resolution=1024, but the shards hold .* set stages.0.resolution = 64",
    ]
    for pattern in expected:
        assert sum(bool(re.search(pattern, line)) for line in lines) == 1, (pattern, text)
    assert len(lines) == len(expected)
    assert not (workdir / "runs").exists()


def test_a_resolution_far_from_the_shards_side_is_refused(workdir, tmp_path):
    write_toy_shards(workdir / "shards" / "mine-64", 4, size=(64, 64), files=1, batch_size=1)
    job = load_job(TINY_JOB, ["stages.0.resolution=256"])
    with pytest.raises(UserError, match=r"resolution=256, but the shards hold 64x64 images"):
        preflight(job)
    preflight(load_job(TINY_JOB, ["stages.0.resolution=72"]))  # within the buckets' spread


def test_latent_channels_that_differ_from_the_autoencoder_name_the_fix(workdir, tmp_path):
    write_toy_shards(workdir / "shards" / "mine-64", 4, size=(64, 64), files=1, batch_size=1)
    named = load_job(TINY_JOB, ["model.name=tiny", "model.overrides.text_taps=12"])
    with pytest.raises(UserError, match=r"set \[model.overrides\] latent_channels = 16"):
        preflight(named)
    from_folder = load_job(TINY_JOB, ["model.autoencoder=pixel"])
    with pytest.raises(
        UserError, match=r"takes latent_channels=16 .* set model.autoencoder to the VAE"
    ):
        preflight(from_folder)


def test_an_override_that_changes_the_folder_s_shape_is_refused(workdir):
    write_toy_shards(workdir / "shards" / "mine-64", 4, size=(64, 64), files=1, batch_size=1)
    with pytest.raises(UserError, match=r"it has width 32 \(config: 64\)"):
        preflight(load_job(TINY_JOB, ["model.overrides.width=64"]))


def test_a_held_out_set_smaller_than_a_batch_is_a_warning(workdir):
    write_toy_shards(workdir / "shards" / "mine-64", 8, size=(64, 64), files=1, batch_size=4)
    write_toy_shards(workdir / "shards" / "eval", 2, size=(64, 64), files=1, batch_size=2)
    job = load_job(TINY_JOB, ["stages.0.batch_size=4", "stages.0.eval_data=['shards/eval']"])
    warnings = preflight(job)
    assert len(warnings) == 1 and "eval_data: stages.0.batch_size=4" in warnings[0]


@pytest.mark.parametrize(("job", "export_step"), [(RELEASE_JOB, 999), (TINY_JOB, 19)])
def test_the_shipped_jobs_keep_the_checkpoint_their_export_example_names(job, export_step):
    cfg = load_job(job)
    ck, stage = cfg.checkpoint, cfg.stages[0]
    saved = [*range(ck.every - 1, stage.steps - 1, ck.every), stage.steps - 1]
    kept = sorted(set(saved) - set(steps_to_delete(saved, ck.keep_last, ck.keep_every, 1)))
    assert export_step in kept
    header = job.read_text()
    assert f"export-lora {cfg.run_dir} " in header and f"--step {export_step}" in header
    assert cfg.model.name is None and stage.lora.enabled and stage.batch_size == 1
