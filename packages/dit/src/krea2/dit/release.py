"""A whole model folder: where its DiT, text encoder, VAE and time-shift settings live.

Two layouts are read. The diffusers pipeline layout: `transformer/`, `text_encoder/`,
`tokenizer/`, `vae/`, `scheduler/scheduler_config.json` and `model_index.json` (whose
`is_distilled` selects Turbo's fixed mu). The native release layout: one DiT
`.safetensors` in released key names at the top, optionally beside `text_encoder/`
(with its tokenizer or a sibling `tokenizer/`) and `vae/`. Either may hold a style module,
`style.safetensors` (krea2.dit.style_module), which is never taken for the DiT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krea2.dit.config import DiTConfig
from krea2.dit.flow import MU_X1, MU_X2, MU_Y1, MU_Y2, TURBO_MU, TimeShift
from krea2.dit.weights import CheckpointError, json_file

STYLE_FILE = "style.safetensors"  # a model folder's style-reference module
# vae/config.json `_class_name` -> the autoencoder's registry name (krea2.dit.components)
VAE_KINDS = {"AutoencoderKLQwenImage": "qwen-image", "AutoencoderKLFlux2": "flux2"}
# Scheduler settings whose sigma grid our Euler sampler does not make; refused when set.
UNSUPPORTED_SCHEDULER = (
    "use_karras_sigmas",
    "use_exponential_sigmas",
    "use_beta_sigmas",
    "invert_sigmas",
    "shift_terminal",
    "stochastic_sampling",
)


@dataclass(frozen=True)
class ModelFolder:
    """The parts of a model folder (None: the folder has no such part)."""

    root: Path
    transformer: Path  # a diffusers transformer folder or a released-format .safetensors
    text_encoder: str | None  # a text-encoder spec, `qwen3-vl:PATH`
    autoencoder: str | None  # an autoencoder spec, e.g. `qwen-image:PATH`
    time_shift: TimeShift | None  # from the scheduler config; None: not recorded
    distilled: bool = False  # model_index.json's is_distilled: a Turbo (few steps, no CFG)
    style: Path | None = None  # the folder's style module (STYLE_FILE), if it has one


def read_model_folder(path: str | Path) -> ModelFolder:
    """The parts of a diffusers pipeline folder or a native release folder (see the module
    docstring); CheckpointError naming the folder and what is missing or malformed."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"--model {root} is not a folder; pass a file with --weights")
    if (root / "transformer" / "config.json").exists():
        transformer = root / "transformer"
    else:
        files = sorted(p for p in root.glob("*.safetensors") if p.name != STYLE_FILE)
        if len(files) != 1:
            found = ", ".join(p.name for p in files) or "none"
            raise CheckpointError(
                f"{root} is not a model folder: it needs transformer/config.json (diffusers "
                f"layout) or one DiT .safetensors at the top (found: {found}); name the DiT "
                "with --weights FILE"
            )
        transformer = files[0]
    text = root / "text_encoder"
    return ModelFolder(
        root=root,
        transformer=transformer,
        text_encoder=f"qwen3-vl:{text}" if (text / "config.json").exists() else None,
        autoencoder=_autoencoder_spec(root / "vae"),
        time_shift=read_time_shift(root),
        distilled=is_distilled(root),
        style=root / STYLE_FILE if (root / STYLE_FILE).is_file() else None,
    )


def is_distilled(root: str | Path) -> bool:
    """Whether a diffusers pipeline folder's ``model_index.json`` marks it distilled
    (``is_distilled``: Turbo's fixed mu, few steps, no CFG); False without one."""
    index = Path(root) / "model_index.json"
    return bool(_object(index).get("is_distilled", False)) if index.exists() else False


def read_dit_config(path: str | Path) -> DiTConfig:
    """The DiT config of released weights without reading a tensor: a model folder (either
    layout), a diffusers transformer folder (its `config.json`) or a `.safetensors` file
    (the config in its metadata, else inferred from the shapes in its header, patch 2).
    CheckpointError naming the path when it holds no DiT."""
    import json

    from krea2.dit.diffusers_config import from_diffusers_config
    from krea2.dit.weights import (
        CONFIG_KEY,
        infer_config,
        is_training_checkpoint,
        training_checkpoint_error,
    )

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if is_training_checkpoint(path):
        raise training_checkpoint_error(path)
    if path.is_dir() and not (path / "config.json").exists():
        path = read_model_folder(path).transformer
    if path.is_dir():
        conf = _object(path / "config.json")
        name = path.parent.name if path.name == "transformer" else path.name
        return from_diffusers_config(conf, int(conf.get("krea2_patch", 2)), name)
    meta, shapes = _safetensors_header(path)
    if CONFIG_KEY in meta:
        return DiTConfig(**json.loads(meta[CONFIG_KEY]))
    import torch

    from krea2.dit.keymap import to_krea

    cfg = infer_config(to_krea({k: torch.empty(s, device="meta") for k, s in shapes.items()}))
    return cfg.replace(name=path.stem)


def _safetensors_header(path: Path) -> tuple[dict[str, str], dict[str, list[int]]]:
    """(metadata, tensor shapes) from a safetensors file's JSON header (8 bytes of length,
    then the header); no tensor byte is read."""
    import json

    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= path.stat().st_size - 8:
                raise ValueError(f"header length {size} does not fit the file")
            header = json.loads(f.read(size))
        meta = header.pop("__metadata__", None) or {}
        return meta, {k: list(v["shape"]) for k, v in header.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"cannot read the safetensors header of {path}: {e}") from e


def _autoencoder_spec(vae: Path) -> str | None:
    if not (vae / "config.json").exists():
        return None
    name = json_file(vae / "config.json").get("_class_name")
    if name not in VAE_KINDS:
        known = ", ".join(VAE_KINDS)
        raise CheckpointError(f"{vae / 'config.json'}: VAE class {name!r} is not one of {known}")
    return f"{VAE_KINDS[name]}:{vae}"


def read_time_shift(root: str | Path) -> TimeShift | None:
    """The mu rule of a diffusers pipeline folder's `scheduler/scheduler_config.json` (and
    `model_index.json`'s `is_distilled`), as `Krea2Pipeline` applies it; None without one.

    Dynamic shifting: mu linear in image tokens from (`base_image_seq_len`, `base_shift`)
    to (`max_image_seq_len`, `max_shift`), or fixed at 1.15 when distilled. Otherwise the
    fixed `shift` s, which is the exponential shift with mu = ln s.
    """
    conf_path = Path(root) / "scheduler" / "scheduler_config.json"
    if not conf_path.exists():
        return None
    conf = _object(conf_path)
    distilled = is_distilled(root)
    bad = [k for k in UNSUPPORTED_SCHEDULER if conf.get(k)]
    if bad or conf.get("time_shift_type", "exponential") != "exponential":
        what = ", ".join(bad) or f"time_shift_type={conf['time_shift_type']!r}"
        raise CheckpointError(
            f"{conf_path}: {what} is not supported (krea2 samples the exponential shift on "
            "a uniform grid); remove it from the scheduler config or pass --mu"
        )
    try:
        if not conf.get("use_dynamic_shifting", False):
            shift = float(conf.get("shift", 1.0))
            if shift <= 0:
                raise ValueError(f"shift {shift} is not positive")
            return TimeShift(fixed=math.log(shift))
        if distilled:
            return TimeShift(fixed=TURBO_MU)
        line = {k: float(conf.get(k, d)) for k, d in _LINE_DEFAULTS.items()}
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{conf_path}: a shift setting is not a number ({e})") from e
    if line["base_image_seq_len"] == line["max_image_seq_len"]:
        raise CheckpointError(f"{conf_path}: base_image_seq_len equals max_image_seq_len")
    return TimeShift(
        x1=line["base_image_seq_len"],
        y1=line["base_shift"],
        x2=line["max_image_seq_len"],
        y2=line["max_shift"],
    )


# Krea2Pipeline's defaults for settings a scheduler config leaves out.
_LINE_DEFAULTS = {
    "base_image_seq_len": MU_X1,
    "base_shift": MU_Y1,
    "max_image_seq_len": MU_X2,
    "max_shift": MU_Y2,
}


def _object(path: Path) -> dict[str, Any]:
    d = json_file(path)
    if not isinstance(d, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return d
