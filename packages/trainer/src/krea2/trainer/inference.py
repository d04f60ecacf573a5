"""Use a trained job after the fact: a stage's weights as a module, its samples, and the
record of how its weights are to be sampled.

``krea2 train sample`` and the demo sample a run exactly the way the trainer's own sample
grids do: the same module (the run's text conditioner included, e.g. its learned word
table), the same autoencoder, prediction type and time shift.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from krea2.infra.checkpoint_layout import scan_checkpoints
from krea2.infra.errors import UserError
from krea2.trainer.build import TrainModule, build_autoencoder, build_module, dit_config
from krea2.trainer.config import (
    CheckpointingMode,
    Float8Recipe,
    JobConfig,
    Prediction,
    StageConfig,
    load_job,
)
from krea2.trainer.distributed import init_distributed
from krea2.trainer.evaluate import sample_grid, save_grid
from krea2.trainer.objective import stage_mu
from krea2.trainer.objectives import stage_sampling
from krea2.trainer.text import LEARNED, text_encoder_spec
from krea2.trainer.validate import autoencoder_spec

if TYPE_CHECKING:
    from torch import Tensor

# How krea2.dit's conditioning record names the trainer's learned word table: only a run's
# own module (krea2 train sample) can rebuild it.
WORDS_SPEC = f"trainer:{LEARNED}"


def stage_root(job: JobConfig, stage: StageConfig) -> Path:
    """The directory holding ``stage``'s ``step-*`` checkpoints."""
    return Path(job.run_dir) / "checkpoints" / stage.name


def checkpoint_steps(job: JobConfig, stage_index: int) -> list[int]:
    """The steps of ``job.stages[stage_index]``'s complete checkpoints, oldest first."""
    return [
        e.step for e in scan_checkpoints(stage_root(job, job.stages[stage_index])) if e.complete
    ]


def load_stage_module(
    job: JobConfig, stage_index: int, trained: bool = True, step: int | None = None
) -> TrainModule:
    """The module of ``job.stages[stage_index]`` in eval mode: with the checkpoint of
    ``step`` (None: the newest complete one) of that stage (``trained``), or the seeded
    initialization the job starts from.

    Raises ``UserError`` when a trained module is asked for and the stage has no checkpoint
    (of that step). Reading never moves or changes a checkpoint.
    """
    import torch.distributed.checkpoint.state_dict as sd

    from krea2.infra.checkpoint import CheckpointManager
    from krea2.trainer.lora import checkpoint_options
    from krea2.trainer.warmstart import warm_start

    stage = job.stages[stage_index]
    env = init_distributed(job)
    module = build_module(job, stage, env)
    if stage.lora.enabled or module.style is not None:
        # the frozen base: the stage's checkpoints hold only its adapters or style module
        warm_start(job, stage_index, module, env.distributed)
    if trained:
        root = stage_root(job, stage)
        steps = checkpoint_steps(job, stage_index)
        if not steps:
            raise UserError(
                f"stage {stage.name!r} has no complete checkpoint under {root}; train it first"
            )
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise UserError(
                f"stage {stage.name!r} has no complete checkpoint of step {step} under {root}; "
                f"its checkpoints are steps {steps}"
            )
        options = checkpoint_options(module)
        state = {"model": sd.get_model_state_dict(module, options=options)}
        CheckpointManager(root).load(state, step=step)
        sd.set_model_state_dict(module, state["model"], options=options)
    return module.eval()


def sample_stage(
    job: JobConfig,
    stage_index: int,
    prompts: list[str],
    seeds: list[int],
    steps: int,
    cfg_scale: float,
    trained: bool = True,
    step: int | None = None,
    on_step: Callable[[], None] | None = None,
    style: tuple[Tensor, Tensor] | None = None,
) -> np.ndarray:
    """uint8 images [len(prompts), len(seeds), side, side, 3] at the stage's resolution,
    sampled with the stage's time shift (Euler, ``steps`` steps, CFG ``cfg_scale``) from its
    checkpoint of ``step`` (None: the newest); ``on_step()`` follows each of the
    ``steps * len(seeds)`` Euler steps (for progress); ``style``: reference latents and
    strengths for a style stage's module (:func:`krea2.trainer.evaluate.sample_grid`)."""
    module = load_stage_module(job, stage_index, trained, step)
    return sample_module(
        job, stage_index, module, prompts, seeds, steps, cfg_scale, on_step, style=style
    )


def sample_module(
    job: JobConfig,
    stage_index: int,
    module: TrainModule,
    prompts: list[str],
    seeds: list[int],
    steps: int,
    cfg_scale: float,
    on_step: Callable[[], None] | None = None,
    style: tuple[Tensor, Tensor] | None = None,
    size: tuple[int, int] | None = None,
    style_times: tuple[float, float] | None = None,
) -> np.ndarray:
    """:func:`sample_stage` with the stage's module already loaded; ``on_step()`` follows
    each of the ``steps * len(seeds)`` Euler steps. ``size``: (width, height) in pixels,
    each a multiple of the autoencoder's factor × the patch (None: the stage's square
    resolution); the time shift follows its token count, as in training's buckets.
    ``style_times``: the flow times (lo, hi) between which ``style`` acts (None: always)."""
    stage = job.stages[stage_index]
    device = next(module.parameters()).device
    ae = build_autoencoder(job.model, device)
    cell = ae.spatial_factor * dit_config(job, stage).patch
    w, h = size or (stage.resolution, stage.resolution)
    if w % cell or h % cell or w <= 0 or h <= 0:
        raise UserError(
            f"--size {w}x{h}: width and height must be positive multiples of {cell} "
            f"(the autoencoder's {ae.spatial_factor} x the patch)"
        )
    mu = stage_mu(stage.time_shift, (w // cell) * (h // cell))
    return sample_grid(
        module, ae, prompts, seeds, (w, h), steps, cfg_scale, mu, on_step, style=style,
        style_times=style_times,
    )  # fmt: skip


def encode_images(job: JobConfig, images: np.ndarray, device: str = "cpu") -> Tensor:
    """The job's autoencoder latents [N, C, h, w] (float32) of uint8 images [N, H, W, 3]
    (e.g. style references for :func:`sample_module`'s ``style``)."""
    import torch

    from krea2.trainer.evaluate import to_unit

    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
        raise UserError(f"images must be uint8 [N, H, W, 3], got {images.dtype} {images.shape}")
    ae = build_autoencoder(job.model, torch.device(device))
    pixels = to_unit(torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2))
    with torch.no_grad():
        return ae.encode(pixels.to(device)).float()


def conditioning_record(job: JobConfig, stage: StageConfig | None) -> dict[str, Any]:
    """How weights of ``job`` (trained in ``stage``; None: a stage is not known) are to be
    sampled, as ``krea2.dit.weights``' conditioning record: the text encoder's registry spec
    (``trainer:words`` for the learned word table), the prediction type, the fixed time
    shift (None: the resolution rule), the text length, the autoencoder and, for a stage
    whose objective says so (a distilled student), ``sampling``: its steps and CFG. Without
    a stage the shift is the stages' common one; UserError when they differ."""
    spec = text_encoder_spec(job.text)
    shifts = {s.time_shift for s in ([stage] if stage is not None else job.stages)}
    if len(shifts) > 1:
        names = [s.name for s in job.stages]
        raise UserError(
            f"the job's stages {names} sample with different time shifts "
            f"{sorted(map(str, shifts))}; name the stage the weights come from (--stage)"
        )
    record: dict[str, Any] = {
        "text_encoder": WORDS_SPEC if spec == LEARNED else spec,
        "prediction": job.model.prediction.value,
        "shift": shifts.pop(),
        "text_tokens": job.text.max_tokens,
        "autoencoder": autoencoder_spec(job.model),
    }
    if job.model.prediction is not Prediction.VELOCITY:
        record["x0_min_t"] = job.model.x0_min_t
    if stage is not None and (sampling := stage_sampling(stage)) is not None:
        record["sampling"] = sampling
    return record


def load_run(run_dir: Path) -> JobConfig:
    """The resolved job config saved in ``run_dir``, set up for sampling in one process
    (no tensor parallelism, no float8, compile or activation checkpointing), with
    ``run_dir`` pointing where the run is now."""
    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        raise UserError(
            f"{run_dir} has no config.toml; point at the run_dir of a krea2 train job "
            "(e.g. runs/toy-pretrain)"
        )
    job = load_job(path, ["parallel.tp=1", "parallel.dp=0"])
    job.run_dir = Path(run_dir)
    for stage in job.stages:
        stage.float8 = Float8Recipe.NONE
        stage.compile = False
        stage.checkpointing = CheckpointingMode.NONE
    return job


def pick_stage(job: JobConfig, name: str | None) -> int:
    """The index of the stage ``name``; None: the last stage that has a checkpoint."""
    names = [s.name for s in job.stages]
    if name is None:
        with_checkpoints = [i for i in range(len(names)) if checkpoint_steps(job, i)]
        if not with_checkpoints:
            raise UserError(
                f"no stage of {job.run_dir} ({names}) has a complete checkpoint yet; "
                "train first or wait for the first checkpoint"
            )
        return with_checkpoints[-1]
    if name not in names:
        raise UserError(f"--stage {name!r} is not a stage of {job.run_dir}; its stages: {names}")
    return names.index(name)


def sample_run(
    run_dir: Path,
    prompts: list[str],
    out: Path,
    stage: str | None = None,
    step: int | None = None,
    seeds: list[int] | None = None,
    steps: int | None = None,
    cfg_scale: float | None = None,
    style_refs: list[tuple[Path, float]] | None = None,
    size: tuple[int, int] | None = None,
    style_times: tuple[float, float] | None = None,
) -> Path:
    """Sample a run's checkpoint the way its trainer does and write ``out/grid.png`` (the
    prompts written under their rows, settings in ``grid.json``) and one PNG per image,
    ``p<row>-s<seed>.png``. ``steps``/``cfg_scale`` None: the stage's own sampling (a
    distilled student's steps without CFG), else 20 steps at CFG 2. ``style_refs``:
    (image, strength) references for a style stage's module, acting while the flow time is
    within ``style_times`` (lo, hi; None: always). ``size``: (width, height),
    None: the stage's square resolution. Shows progress (a bar on a terminal). Returns the
    grid's path."""
    from PIL import Image

    from krea2.infra.progress import progress

    if not prompts:
        raise UserError("give at least one --prompt")
    seeds = seeds or [0]
    job = load_run(run_dir)
    index = pick_stage(job, stage)
    available = checkpoint_steps(job, index)
    if step is None and available:
        step = available[-1]
    name = job.stages[index].name
    own = stage_sampling(job.stages[index]) or {"steps": 20, "cfg": 2.0}
    steps = own["steps"] if steps is None else steps
    cfg_scale = own["cfg"] if cfg_scale is None else cfg_scale
    if style_times is not None and not style_refs:
        raise UserError("--style-times needs a --style-ref to time")
    style = _style_inputs(job, index, style_refs) if style_refs else None
    module = load_stage_module(job, index, trained=True, step=step)
    with progress(f"sample {name}", steps * len(seeds), unit="step") as bar:
        images = sample_module(
            job, index, module, prompts, seeds, steps, cfg_scale, bar.advance, style, size,
            style_times,
        )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    for i in range(len(prompts)):
        for j, seed in enumerate(seeds):
            Image.fromarray(images[i, j]).save(out / f"p{i:02d}-s{seed}.png")
    info = {
        "run_dir": str(run_dir),
        "stage": name,
        "step": step,
        "seeds": seeds,
        "steps": steps,
        "cfg": cfg_scale,
        "size": list(images.shape[3:1:-1]),  # width, height
        "conditioning": conditioning_record(job, job.stages[index]),
        "style_refs": [[str(p), s] for p, s in style_refs or []],
        "style_times": list(style_times) if style_times is not None else None,
    }
    return save_grid(images, prompts, out / "grid.png", info)


def _style_inputs(
    job: JobConfig, index: int, refs: list[tuple[Path, float]]
) -> tuple[Tensor, Tensor]:
    """(latents [1, R, C, h, w], strengths [1, R]) of ``refs`` at the stage's resolution;
    UserError (before the DiT loads) when the stage trains no style module, a reference
    is unreadable, or there are more than its module takes."""
    import torch

    from krea2.dit import style_reference_latents
    from krea2.trainer.style_settings import style_origin, style_settings_of

    stage = job.stages[index]
    origin = style_origin(job.stages, index)
    if origin is None:
        raise UserError(
            f'--style-ref needs a style stage (objective = "style", or one with style_from); '
            f"stage {stage.name!r} trains {stage.objective!r}"
        )
    settings = style_settings_of(origin)
    if len(refs) > settings.max_refs:
        raise UserError(f"{len(refs)} --style-ref given; stage {stage.name!r} takes at most "
                        f"{settings.max_refs}")  # fmt: skip
    ae = build_autoencoder(job.model, torch.device("cpu"))
    side = stage.resolution
    latents = style_reference_latents([path for path, _ in refs], ae, (side, side))
    return latents, torch.tensor([[s for _, s in refs]], dtype=torch.float32)
