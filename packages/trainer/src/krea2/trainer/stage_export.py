"""A finished stage as a model users run: the release's single file, or a whole diffusers
pipeline folder that ``Krea2Pipeline.from_pretrained`` loads.

The stage's result is its newest checkpoint's DiT (a LoRA stage's merged onto its base).
``release``: one ``.safetensors`` in the released key names with the DiT config and the
conditioning record (how to sample it: text encoder, prediction, shift, text length,
autoencoder), what ``krea2 dit sample`` reads. ``diffusers``: ``transformer/`` in
diffusers' names beside the text encoder, tokenizer, VAE and scheduler of the model
folder the run's components come from (copied), and its ``model_index.json``; only a run
with the release's components (a Qwen3-VL text encoder and the Qwen-Image VAE, from one
model folder) has such a pipeline. The folder samples on the stage's own grid: a stage
with a fixed time shift mu gets a static-shift scheduler (``shift`` = e^mu), and a
distilled stage (its objective records ``sampling``: few steps, no CFG) at the release
Turbo's mu 1.15 is marked ``is_distilled`` as the released Turbo is.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from torch import Tensor

from krea2.infra.errors import UserError
from krea2.trainer.config import JobConfig

__all__ = ["LAYOUTS", "export_stage", "stage_weights"]

LAYOUTS = ("release", "diffusers")
PIPELINE_PARTS = ("text_encoder", "tokenizer", "vae", "scheduler")


def stage_weights(job: JobConfig, index: int) -> dict[str, Tensor]:
    """The DiT of stage ``index``'s newest checkpoint in released key names (a LoRA stage's
    adapter merged onto its base); UserError when the stage has no checkpoint."""
    from krea2.infra.checkpoint import CheckpointManager
    from krea2.trainer.adapters import base_weights
    from krea2.trainer.checkpoint_tensors import read_adapter
    from krea2.trainer.lora import merge_into
    from krea2.trainer.merge import average
    from krea2.trainer.warmstart import stage_checkpoints

    stage = job.stages[index]
    mgr = CheckpointManager(stage_checkpoints(job.run_dir, stage.name))
    step = mgr.latest_step()
    if step is None:
        raise UserError(f"stage {stage.name!r} has no checkpoint under {mgr.root}; train it first")
    if stage.lora.enabled:
        adapter = read_adapter(mgr.path_of(step))
        return merge_into(base_weights(job, index, None), adapter, stage.lora.scale)
    return average([mgr.path_of(step)])


def component_folder(job: JobConfig) -> Path:
    """The model folder the run's text encoder and VAE come from (it holds
    ``text_encoder/``, ``tokenizer/``, ``vae/`` and ``scheduler/``); UserError naming what
    the run uses instead."""
    from krea2.trainer.text import text_encoder_spec
    from krea2.trainer.validate import autoencoder_spec

    text, ae = text_encoder_spec(job.text), autoencoder_spec(job.model)
    kind, _, path = text.partition(":")
    ae_kind, _, ae_path = ae.partition(":")
    if kind != "qwen3-vl" or ae_kind != "qwen-image" or not path:
        raise UserError(
            f"a diffusers pipeline needs the release's components; this run uses text "
            f"encoder {text!r} and autoencoder {ae!r}: export --layout release instead"
        )
    folder = Path(path).parent
    missing = [p for p in PIPELINE_PARTS if not (folder / p).is_dir()]
    if missing or Path(ae_path).resolve().parent != folder.resolve():
        raise UserError(
            f"{folder} is not a model folder holding the run's text encoder and VAE "
            f"(missing {missing or ['the VAE ' + ae_path]}); export --layout release instead"
        )
    return folder


def export_stage(
    job: JobConfig, index: int, out: Path, layout: str = "release", force: bool = False
) -> Path:
    """Write stage ``index``'s result to ``out`` in ``layout`` (:data:`LAYOUTS`; release: a
    ``.safetensors`` file, diffusers: a folder); an existing ``out`` is replaced only with
    ``force``. Returns ``out``."""
    from krea2.dit.testing import pipeline_index
    from krea2.dit.weights import save_weights
    from krea2.trainer.build import dit_config
    from krea2.trainer.inference import conditioning_record

    if layout not in LAYOUTS:
        raise UserError(f"--layout {layout!r}: choose {' or '.join(LAYOUTS)}")
    if layout == "release" and out.suffix != ".safetensors":
        raise UserError(f"--layout release writes one .safetensors file; --out {out} is not one")
    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to replace it")
    stage = job.stages[index]
    folder = component_folder(job) if layout == "diffusers" else None
    weights = stage_weights(job, index)
    cfg, record = dit_config(job, stage), conditioning_record(job, stage)
    if layout == "release":
        return save_weights(weights, out, config=cfg, conditioning=record)
    assert folder is not None
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_weights(weights, tmp / "transformer", format="diffusers", config=cfg,
                 conditioning=record)  # fmt: skip
    for part in PIPELINE_PARTS:
        shutil.copytree(folder / part, tmp / part)
    index_file = folder / "model_index.json"
    if index_file.is_file():
        index_data = json.loads(index_file.read_text())
    else:
        text_class = json.loads((folder / "text_encoder" / "config.json").read_text())
        names = text_class.get("architectures") or ["Qwen3VLModel"]
        index_data = pipeline_index(tmp, names[0], False, cfg.patch)
    index_data["is_distilled"] = _own_grid(tmp / "scheduler", record)
    (tmp / "model_index.json").write_text(json.dumps(index_data, indent=2))
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    tmp.rename(out)
    return out


def _own_grid(scheduler: Path, record: dict) -> bool:
    """Make the copied ``scheduler`` sample on the stage's grid (``record``: its
    conditioning record) and say whether the folder is a release-style distilled model
    (``is_distilled``: Krea2Pipeline then fixes mu at 1.15). The resolution rule keeps the
    release's dynamic shifting; another fixed mu becomes a static ``shift`` = e^mu, which
    diffusers' scheduler applies in place of the pipeline's mu."""
    from krea2.dit.flow import TURBO_MU

    mu = record.get("shift")
    distilled = "sampling" in record and mu is not None and math.isclose(mu, TURBO_MU)
    if mu is not None and not distilled:
        path = scheduler / "scheduler_config.json"
        conf = json.loads(path.read_text())
        conf.update(use_dynamic_shifting=False, shift=math.exp(mu))
        path.write_text(json.dumps(conf, indent=2))
    return distilled
