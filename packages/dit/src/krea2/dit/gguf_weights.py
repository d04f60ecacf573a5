"""DiT weights as GGUF (the `gguf` package): written in the layout the ComfyUI GGUF loaders
use for Krea 2, read back dequantized for sampling.

Layout (the convention of ComfyUI-GGUF's converters for DiT image models, architecture
``krea2``): ``general.architecture = "krea2"``, the quantization version and file type;
tensor names are the released checkpoint keys (``blocks.0.attn.wq.weight``, no prefix);
1-D tensors, tensors of at most 1024 values, the modulation and timestep weights
(``mod.lin``, ``last.modulation.lin``, ``tmlp.``, ``tproj.``) are kept in F32; every other
weight in the chosen type, or F16 where its rows do not split into the type's blocks (32
values for the Q types). Our config and conditioning record travel as the strings
``krea2.config`` and ``krea2.conditioning`` (JSON), so a GGUF samples like the
.safetensors it came from. Types: Q8_0, Q5_1, Q5_0, Q4_1, Q4_0 (the block types gguf's
numpy quantizer writes), F16, BF16. Needs gguf (`pip install 'krea2-dit[gguf]'`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from krea2.dit.conditioning_record import check_conditioning
from krea2.infra.errors import UserError

__all__ = ["GGUF_TYPES", "gguf_tensor_types", "read_gguf", "read_gguf_records", "save_gguf"]

GGUF_TYPES = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "F16", "BF16")
ARCH = "krea2"
CONFIG_FIELD, CONDITIONING_FIELD = "krea2.config", "krea2.conditioning"
FULL_PRECISION_KEYS = ("mod.lin", "last.modulation.lin", "tmlp.", "tproj.")
SMALL = 1024  # tensors of at most this many values stay F32: their bytes do not matter


def _gguf():
    try:
        import gguf
    except ImportError:
        raise UserError("GGUF needs the gguf package: pip install 'krea2-dit[gguf]'") from None
    return gguf


def tensor_type(key: str, shape: tuple[int, ...], qtype: str) -> str:
    """The GGUF type ``key`` of ``shape`` is stored in for file type ``qtype``."""
    if len(shape) == 1 or int(np.prod(shape)) <= SMALL:
        return "F32"
    if any(part in key for part in FULL_PRECISION_KEYS):
        return "F32"
    return qtype


def save_gguf(
    sd: Mapping[str, Tensor],
    path: str | Path,
    qtype: str,
    config: Any | None = None,
    conditioning: Mapping[str, Any] | None = None,
) -> Path:
    """Write released-key weights ``sd`` to ``path`` (.gguf) with its big weights in
    ``qtype`` (module docstring); ``config`` (a DiTConfig) and ``conditioning`` recorded.
    Written to a temporary name and renamed, so a crash never leaves a torn .gguf."""
    import dataclasses

    gguf = _gguf()
    if qtype not in GGUF_TYPES:
        raise UserError(f"GGUF type {qtype!r}: choose one of {', '.join(GGUF_TYPES)}")
    types = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(path=None, arch=ARCH)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}"))
    if config is not None:
        writer.add_string(CONFIG_FIELD, json.dumps(dataclasses.asdict(config)))
    if conditioning is not None:
        writer.add_string(CONDITIONING_FIELD, json.dumps(check_conditioning(conditioning)))
    for key, value in sd.items():
        data = value.detach().float().cpu().numpy()
        if data.ndim == 0:
            data = data.reshape(1)  # GGUF has no scalars; read_gguf gives the shape back
            writer.add_array(f"krea2.scalar.{key}", [1])
        kind = tensor_type(key, data.shape, qtype)
        try:
            packed = gguf.quants.quantize(data, getattr(types, kind))
        except gguf.QuantError:  # rows that do not split into the type's blocks
            kind = "F16"
            packed = gguf.quants.quantize(data, types.F16)
        writer.add_tensor(key, packed, raw_dtype=getattr(types, kind))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    writer.write_header_to_file(path=tmp)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def _reader(path: Path):
    gguf = _gguf()
    if not path.is_file():
        raise UserError(f"GGUF file {path} does not exist")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # a torn or foreign file: the reader says why
        raise UserError(f"cannot read GGUF file {path}: {e}") from None


def _string(reader, name: str) -> str | None:
    field = reader.fields.get(name)
    return None if field is None else bytes(field.parts[field.data[0]]).decode()


def read_gguf(
    path: str | Path, device: torch.device | str = "cpu"
) -> tuple[dict[str, Tensor], dict[str, Any] | None, dict[str, Any] | None]:
    """(released-key float32 weights dequantized on ``device``, the recorded config as a
    dict or None, the conditioning record or None). UserError for a file that is not
    a readable Krea 2 GGUF."""
    gguf = _gguf()
    path = Path(path)
    reader = _reader(path)
    arch = _string(reader, "general.architecture")
    if arch != ARCH:
        raise UserError(f"{path} is a GGUF of architecture {arch!r}, not {ARCH!r}")
    sd = {}
    for t in reader.tensors:  # tensors are memory-mapped: dequantized one at a time
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims innermost first
        if f"krea2.scalar.{t.name}" in reader.fields:
            shape = ()
        # a copy: F32 tensors come straight from the read-only memory map
        sd[t.name] = torch.from_numpy(np.array(data, np.float32, copy=True)).reshape(shape)
    if not sd:
        raise UserError(f"GGUF file {path} holds no tensors")
    config, conditioning = _records(reader, path)
    return {k: v.to(device) for k, v in sd.items()}, config, conditioning


def _records(reader, path: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    out = []
    for name in (CONFIG_FIELD, CONDITIONING_FIELD):
        text = _string(reader, name)
        try:
            out.append(None if text is None else json.loads(text))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: {name} is not JSON ({e})") from None
    return out[0], out[1]


def read_gguf_records(path: str | Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(config dict, conditioning record) a .gguf records (each None when absent), without
    dequantizing its tensors."""
    return _records(_reader(Path(path)), Path(path))


def gguf_tensor_types(path: str | Path) -> dict[str, str]:
    """Each tensor's stored GGUF type name (``Q8_0``, ``F32``, ...) by its key."""
    return {t.name: t.tensor_type.name for t in _reader(Path(path)).tensors}
