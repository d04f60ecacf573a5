"""The DiT config of a job — a named ``krea2.dit`` config, or the shape of the released
weights the job starts from (read from their config files, no tensor loaded), with the
job's overrides and a stage's patch — and whether the job's autoencoder, text encoder and
released weights fit it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from krea2.trainer.config import JobConfig, StageConfig

if TYPE_CHECKING:
    from krea2.dit.config import DiTConfig

# The config that a job naming no model and starting from no released weights trains.
DEFAULT_MODEL = "toy"


def shape_source(cfg: JobConfig) -> Path | None:
    """The released weights whose DiT shape the job takes when ``model.name`` is not set:
    those the first stage starting from released weights names in ``init_from`` (a model
    folder, a transformer folder or a ``.safetensors``). None when the job names its model
    or no stage starts from released weights. UserError for an init_from that is missing."""
    from krea2.trainer.release_init import release_source

    if cfg.model.name is not None:
        return None
    for stage in cfg.stages:
        if stage.init_from in ("previous", "none"):
            continue
        weights = release_source(stage.init_from)
        if weights is not None:
            return weights
    return None


def dit_config(cfg: JobConfig, stage: StageConfig | None = None) -> DiTConfig:
    """The DiT config of the job (see :func:`shape_source`), with ``model.overrides`` and
    ``stage``'s patch when it sets one."""
    from krea2.dit.config import check_overrides, get_config
    from krea2.dit.release import read_dit_config

    overrides = dict(cfg.model.overrides)
    if stage is not None and stage.patch is not None:
        overrides["patch"] = stage.patch
    source = shape_source(cfg)
    if source is None:
        return get_config(cfg.model.name or DEFAULT_MODEL, **overrides)
    check_overrides(overrides, "model.overrides.")
    base = read_dit_config(source)
    return base.replace(name=base.name, **overrides) if overrides else base


def fit_problems(cfg: JobConfig, model: DiTConfig, autoencoder: str, channels: int) -> list[str]:
    """Every way the job's parts do not fit its DiT ``model``, one line each with the fix,
    from config files only: the autoencoder ``autoencoder`` (giving ``channels`` latent
    channels), the text encoder's config, and each stage's released ``init_from``."""
    from krea2.infra.errors import UserError

    origin = shape_source(cfg)
    checks = [
        lambda: _latent_problem(model, origin, autoencoder, channels),
        lambda: _text_problem(cfg, model, origin),
        *(lambda i=i: _init_problem(cfg, i) for i in range(len(cfg.stages))),
    ]
    problems = []
    for check in checks:
        try:
            problem = check()
        except UserError as e:
            problem = str(e)
        if problem is not None:
            problems.append(problem)
    return problems


def _folder_part(origin: Path | None, part: str) -> str:
    """`` (e.g. 'KIND:FOLDER/part')`` when the model folder of ``origin`` has ``part``."""
    if origin is None:
        return ""
    folder = origin.parent if origin.name == "transformer" or origin.is_file() else origin
    kind = {"vae": "qwen-image", "text_encoder": "qwen3-vl"}[part]
    return f" (e.g. '{kind}:{folder / part}')" if (folder / part / "config.json").exists() else ""


def _latent_problem(
    model: DiTConfig, origin: Path | None, autoencoder: str, channels: int
) -> str | None:
    if channels == model.latent_channels:
        return None
    if origin is not None:
        return (
            f"the DiT of {origin} takes latent_channels={model.latent_channels} but the "
            f"autoencoder {autoencoder} gives {channels}; set model.autoencoder to the VAE "
            f"the DiT was trained with{_folder_part(origin, 'vae')}"
        )
    return (
        f"model {model.name!r} has latent_channels={model.latent_channels} but the "
        f"autoencoder {autoencoder} gives {channels}; set [model.overrides] latent_channels = "
        f"{channels}, or an autoencoder with {model.latent_channels} channels"
    )


def _text_problem(cfg: JobConfig, model: DiTConfig, origin: Path | None) -> str | None:
    from krea2.dit.components import parse_text_encoder, text_shape
    from krea2.trainer.text import LEARNED, text_encoder_spec

    spec = text_encoder_spec(cfg.text)
    if spec == LEARNED:
        return None
    path = parse_text_encoder(spec).path
    if path is not None and not path.exists():
        return f"text.encoder={spec!r}: {path} does not exist; give a local model"
    shape = text_shape(spec, model)
    if (shape.taps, shape.dim) == (model.text_taps, model.text_dim):
        return None
    gives = f"text.encoder {spec!r} gives {shape.taps} taps x {shape.dim} features per token"
    if origin is not None:
        return (
            f"{gives}, but the DiT of {origin} takes text_taps={model.text_taps} x "
            f"text_dim={model.text_dim}; set text.encoder to the encoder the DiT was trained "
            f"with{_folder_part(origin, 'text_encoder')}"
        )
    return (
        f"{gives}, but model {model.name!r} has text_taps={model.text_taps}, text_dim="
        f"{model.text_dim}; set [model.overrides] text_taps = {shape.taps}, text_dim = "
        f"{shape.dim}, or the text encoder the DiT was trained with"
    )


def _init_problem(cfg: JobConfig, index: int) -> str | None:
    from krea2.dit.release import read_dit_config
    from krea2.trainer.release_init import SHAPE_FIX, release_source, shape_differences

    stage = cfg.stages[index]
    if stage.init_from in ("previous", "none") or not Path(stage.init_from).exists():
        return None  # the stage checks name a missing init_from
    weights = release_source(stage.init_from)
    if weights is None:
        return None
    want = dit_config(cfg, stage)
    differ = shape_differences(read_dit_config(weights), want)
    if not differ:
        return None
    return (
        f"stage {stage.name!r}: init_from {stage.init_from} holds a DiT that does not fit "
        f"model {want.name!r}: it has {', '.join(differ)}. {SHAPE_FIX}"
    )
