"""Load and save DiT weights in the released (Krea) and diffusers formats; convert between them."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from krea2.dit.conditioning_record import check_conditioning
from krea2.dit.config import DiTConfig, swiglu_hidden
from krea2.dit.diffusers_config import from_diffusers_config, to_diffusers_config
from krea2.dit.keymap import detect_format, krea_to_diffusers, strip_prefix, to_krea
from krea2.infra.errors import UserError

CONFIG_KEY = "krea2.dit.config"  # safetensors metadata entry holding our DiTConfig as JSON
# safetensors metadata entry recording how the weights are conditioned (see check_conditioning)
CONDITIONING_KEY = "krea2.dit.conditioning"
DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors"
DIFFUSERS_INDEX = "diffusion_pytorch_model.safetensors.index.json"


class CheckpointError(UserError):
    """A checkpoint that does not fit the model (keys, shapes, dtypes) or cannot be read."""


_STEP_DIR = re.compile(r"^step-\d+$")


def is_training_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a distributed (DCP) training checkpoint folder, e.g. a run's
    `checkpoints/STAGE/step-N`, rather than DiT weights."""
    path = Path(path)
    if not path.is_dir():
        return False
    has_dcp = (path / ".metadata").exists() or any(path.glob("*.distcp"))
    return has_dcp or bool(_STEP_DIR.match(path.name))


def training_checkpoint_error(path: str | Path) -> CheckpointError:
    """The refusal for a DCP folder passed as weights, with the commands that do sample it."""
    path = Path(path)
    run, stage = "RUN_DIR", "STAGE"
    if path.parent.parent.name == "checkpoints":
        run, stage = str(path.parent.parent.parent), path.parent.name
    return CheckpointError(
        f"{path} is a training checkpoint (DCP), not DiT weights; sample it with "
        f"`krea2 train sample {run} --stage {stage} --prompt ...`, or export weights with "
        f"`krea2 train pma {run} --stage {stage} --out model.safetensors`"
    )


def json_file(path: Path) -> Any:
    """The JSON content of `path`; CheckpointError naming the file when unreadable or malformed."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e


def _read_safetensors(path: Path, device: str = "cpu") -> tuple[dict[str, Tensor], dict[str, str]]:
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = f.metadata() or {}
            return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"cannot read safetensors file {path}: {e}") from e


def read_checkpoint(
    path: str | Path, device: torch.device | str = "cpu"
) -> tuple[dict[str, Tensor], DiTConfig | None]:
    """(state dict with released key names on `device`, config if the file records one).

    `path`: a .safetensors file (released keys, optional `diffusion_model.` prefix, or
    diffusers keys), a diffusers folder (config.json + diffusion_pytorch_model*.safetensors)
    or a .gguf (`krea2.dit.gguf_weights`: dequantized to float32).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.suffix == ".gguf":
        from krea2.dit.gguf_weights import read_gguf

        sd, conf, _ = read_gguf(path, device)
        return sd, (DiTConfig(**conf) if conf is not None else None)
    if is_training_checkpoint(path):
        raise training_checkpoint_error(path)
    cfg = None
    if path.is_dir():
        conf = path / "config.json"
        if (path / "transformer" / "config.json").exists():
            path, conf = path / "transformer", path / "transformer" / "config.json"
        if not conf.exists():
            raise CheckpointError(f"{path} is a folder without config.json (not a diffusers model)")
        d = json_file(conf)
        cfg = from_diffusers_config(d, patch=int(d.get("krea2_patch", 2)), name=path.name)
        if (path / DIFFUSERS_INDEX).exists():
            index = json_file(path / DIFFUSERS_INDEX)
            sd: dict[str, Tensor] = {}
            for shard in sorted(set(index["weight_map"].values())):
                sd.update(_read_safetensors(path / shard, device)[0])
        elif (path / DIFFUSERS_WEIGHTS).exists():
            sd = _read_safetensors(path / DIFFUSERS_WEIGHTS, device)[0]
        else:
            raise CheckpointError(f"{path} has config.json but no {DIFFUSERS_WEIGHTS}")
    else:
        sd, meta = _read_safetensors(path, device)
        if CONFIG_KEY in meta:
            cfg = DiTConfig(**json.loads(meta[CONFIG_KEY]))
    if not sd:
        raise CheckpointError(f"checkpoint {path} holds no tensors")
    return to_krea(sd), cfg


def infer_config(sd: dict[str, Tensor], patch: int = 2) -> DiTConfig:
    """A DiTConfig from the shapes of a released-format state dict (RoPE axes by formula)."""
    sd = strip_prefix(sd)
    try:
        width, in_ch = sd["first.weight"].shape
        hd = sd["blocks.0.attn.qknorm.qnorm.scale"].shape[0]
        thd = sd["txtfusion.refiner_blocks.0.attn.qknorm.qnorm.scale"].shape[0]
        text_dim = sd["txtmlp.0.scale"].shape[0]
    except KeyError as e:
        raise CheckpointError(f"cannot infer the config: key {e.args[0]!r} is missing") from e

    def count(prefix: str) -> int:
        return len({k.split(".")[len(prefix.split("."))] for k in sd if k.startswith(prefix + ".")})

    cfg = DiTConfig(
        width=width,
        depth=count("blocks"),
        heads=width // hd,
        kv_heads=sd["blocks.0.attn.wk.weight"].shape[0] // hd,
        mlp_hidden=sd["blocks.0.mlp.gate.weight"].shape[0],
        time_dim=sd["tmlp.0.weight"].shape[1],
        text_dim=text_dim,
        text_taps=sd["txtfusion.projector.weight"].shape[1],
        text_heads=text_dim // thd,
        text_kv_heads=sd["txtfusion.refiner_blocks.0.attn.wk.weight"].shape[0] // thd,
        text_mlp_hidden=sd["txtfusion.refiner_blocks.0.mlp.gate.weight"].shape[0],
        layerwise_blocks=count("txtfusion.layerwise_blocks"),
        refiner_blocks=count("txtfusion.refiner_blocks"),
        patch=patch,
        latent_channels=in_ch // (patch * patch),
        attn_gate="blocks.0.attn.gate.weight" in sd,
        name="inferred",
    )
    # Keep derivable sizes implicit so an inferred release config equals the named one.
    if cfg.mlp_hidden == swiglu_hidden(cfg.width, cfg.mlp_multiplier):
        cfg.mlp_hidden = None
    if cfg.text_mlp_hidden == swiglu_hidden(cfg.text_dim, cfg.mlp_multiplier):
        cfg.text_mlp_hidden = None
    return cfg


def _weights_file(path: Path) -> Path:
    """The safetensors file whose metadata describes `path` (a file or diffusers folder)."""
    if not path.is_dir():
        return path
    if (path / "transformer").is_dir():
        path = path / "transformer"
    if (path / DIFFUSERS_INDEX).exists():
        index = json_file(path / DIFFUSERS_INDEX)
        return path / sorted(set(index.get("weight_map", {}).values()))[0]
    return path / DIFFUSERS_WEIGHTS


def read_conditioning(path: str | Path) -> dict[str, Any] | None:
    """The conditioning record (see `check_conditioning`) of a checkpoint file or diffusers
    folder, or None when it records none (released weights). CheckpointError for a missing
    path or a training checkpoint folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if is_training_checkpoint(path):
        raise training_checkpoint_error(path)
    if path.suffix == ".gguf":
        from krea2.dit.gguf_weights import read_gguf_records

        record = read_gguf_records(path)[1]
        return None if record is None else check_conditioning(record, f"{path}: conditioning")
    file = _weights_file(path)
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"cannot read safetensors file {file}: {e}") from e
    if CONDITIONING_KEY not in meta:
        return None
    try:
        record = json.loads(meta[CONDITIONING_KEY])
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: metadata {CONDITIONING_KEY!r} is not JSON ({e})") from e
    if not isinstance(record, dict):
        raise CheckpointError(f"{file}: metadata {CONDITIONING_KEY!r} is not a JSON object")
    return check_conditioning(record, f"{file}: {CONDITIONING_KEY}")


def load_weights(
    model: nn.Module,
    source: str | Path | dict[str, Tensor],
    *,
    assign: bool = False,
    dtype: torch.dtype | None = None,
) -> None:
    """Strictly load a checkpoint (path or state dict, either format) into a Krea2DiT.

    Raises CheckpointError naming the first missing and first unexpected key (with counts),
    a shape mismatch, or a dtype mismatch. With `assign` (meta-built models) tensors are
    adopted without a copy; their floating dtype must then equal the model's, or `dtype`
    must be given to cast while loading.
    """
    sd = read_checkpoint(source)[0] if isinstance(source, str | Path) else to_krea(source)
    want = model.state_dict()
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (first: {missing[0]!r})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (first: {unexpected[0]!r})")
        raise CheckpointError(
            f"checkpoint does not match config {model.cfg.name!r}: {', '.join(parts)}; "
            "check --config / the checkpoint's model shape"
        )
    for k, ref in want.items():
        v = sd[k]
        if tuple(v.shape) != tuple(ref.shape):
            raise CheckpointError(
                f"checkpoint tensor {k!r} has shape {tuple(v.shape)}, model expects "
                f"{tuple(ref.shape)} (config {model.cfg.name!r})"
            )
        if not v.is_floating_point():
            raise CheckpointError(f"checkpoint tensor {k!r} has non-float dtype {v.dtype}")
        target = dtype or ref.dtype
        if v.dtype != target:
            if assign and dtype is None:
                raise CheckpointError(
                    f"checkpoint tensor {k!r} is {v.dtype} but the model expects {ref.dtype}; "
                    f"pass dtype={v.dtype} (CLI --dtype) to load as is, or cast the checkpoint"
                )
            sd[k] = v.to(target)
    model.load_state_dict(sd, strict=True, assign=assign)


def from_pretrained(
    path: str | Path,
    *,
    config: DiTConfig | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """Build a Krea2DiT on the meta device and load `path` with assign (no second copy).

    The config comes from `config`, else the file's metadata or diffusers config.json, else
    it is inferred from tensor shapes. `dtype` casts every tensor (norms included);
    None keeps the checkpoint's dtypes.
    """
    from krea2.dit.model import Krea2DiT

    # Tensors are read straight onto `device` and cast one at a time, so at most one
    # tensor exists twice; the model itself is built on meta and adopts them (assign).
    sd, file_cfg = read_checkpoint(path, device)
    cfg = config or file_cfg or infer_config(sd)
    with torch.device("meta"):
        model = Krea2DiT(cfg)
    if dtype is not None:
        for k in list(sd):
            sd[k] = sd[k].to(dtype)
        model = model.to(dtype)
    else:
        dtypes = {v.dtype for v in sd.values()}
        if len(dtypes) == 1:
            model = model.to(next(iter(dtypes)))
        else:  # mixed checkpoints (e.g. bf16 matmuls, fp32 norms): adopt each tensor's dtype
            for name, p in model.named_parameters():
                p.data = p.data.to(sd[name].dtype)
    load_weights(model, sd, assign=True)
    return model.eval()


def save_weights(
    model_or_sd: nn.Module | dict[str, Tensor],
    path: str | Path,
    *,
    format: str = "krea",
    config: DiTConfig | None = None,
    conditioning: Mapping[str, Any] | None = None,
) -> Path:
    """Save in the released key names (`format="krea"`, one .safetensors with our config in
    the metadata) or as a diffusers folder (`format="diffusers"`: config.json +
    diffusion_pytorch_model.safetensors, loadable by Krea2Transformer2DModel.from_pretrained).

    `conditioning`: how the weights are to be sampled (see `check_conditioning`), stored as
    JSON under the metadata entry CONDITIONING_KEY; `read_conditioning` gives it back.
    """
    cond = {}
    if conditioning is not None:
        cond = {CONDITIONING_KEY: json.dumps(check_conditioning(conditioning))}
    if isinstance(model_or_sd, nn.Module):
        cfg = config or model_or_sd.cfg
        sd = model_or_sd.state_dict()
    else:
        cfg, sd = config, to_krea(model_or_sd)
    sd = {k: v.detach().contiguous().cpu() for k, v in sd.items()}
    path = Path(path)
    if format == "krea":
        meta = {CONFIG_KEY: json.dumps(dataclasses.asdict(cfg))} if cfg is not None else {}
        meta |= cond
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file(sd, str(tmp), metadata=meta)
        tmp.replace(path)
        return path
    if format == "diffusers":
        if cfg is None:
            raise UserError("saving in the diffusers format needs the model config")
        dconf = to_diffusers_config(cfg) | {"_diffusers_version": _diffusers_version()}
        if cfg.patch != 2:
            dconf["krea2_patch"] = cfg.patch  # a pipeline setting; recorded for our reader
        path.mkdir(parents=True, exist_ok=True)
        dsd = {k: v.contiguous() for k, v in krea_to_diffusers(sd).items()}
        save_file(dsd, str(path / DIFFUSERS_WEIGHTS), metadata={"format": "pt"} | cond)
        (path / "config.json").write_text(json.dumps(dconf, indent=2) + "\n")
        return path
    raise UserError(f"unknown weights format {format!r}; choose 'krea' or 'diffusers'")


def convert(src: str | Path, dst: str | Path, to: str, qtype: str = "Q8_0") -> Path:
    """Convert a checkpoint file/folder to `to` = "diffusers" (folder), "krea" (file) or
    "gguf" (file, big weights in `qtype`), keeping its conditioning record."""
    sd, cfg = read_checkpoint(src)
    if cfg is None:
        cfg = infer_config(sd)
    conditioning = read_conditioning(src)
    if to == "gguf":
        from krea2.dit.gguf_weights import save_gguf

        return save_gguf(sd, dst, qtype, config=cfg, conditioning=conditioning)
    return save_weights(sd, dst, format=to, config=cfg, conditioning=conditioning)


def _diffusers_version() -> str:
    import diffusers

    return diffusers.__version__


__all__ = [
    "CONDITIONING_KEY",
    "CheckpointError",
    "check_conditioning",
    "convert",
    "detect_format",
    "from_pretrained",
    "infer_config",
    "is_training_checkpoint",
    "load_weights",
    "read_checkpoint",
    "read_conditioning",
    "save_weights",
]
