"""The settings a job's TOML chooses from (StrEnums, parsed when a config is loaded) and
the parser that turns strings into them for configs built in code."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import typing
from typing import Any


class OptimizerName(enum.StrEnum):
    ADAMW = "adamw"
    MUON = "muon"  # torch.optim.Muon on hidden matrices, AdamW on the rest


class ScheduleDecay(enum.StrEnum):
    LINEAR = "linear"
    SQRT = "sqrt"
    COSINE = "cosine"


class SpikeAction(enum.StrEnum):
    SKIP = "skip"  # drop this step's update
    ROLLBACK = "rollback"  # reload the last checkpoint and skip the offending batch
    LOG = "log"  # only report


class Float8Recipe(enum.StrEnum):
    NONE = "none"
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"


class CheckpointingMode(enum.StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class ParamDtype(enum.StrEnum):
    """Parameter dtype on one device (a ``torch`` attribute name)."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class BaseQuant(enum.StrEnum):
    """How a LoRA stage stores its frozen base's block Linears (torchao weight-only)."""

    NONE = "none"
    INT8 = "int8"  # per-channel int8 weights; CPU and GPU
    FLOAT8 = "float8"  # float8 e4m3 weights; CUDA with compute capability 8.9+ only


class Autocast(enum.StrEnum):
    """The forward's ``torch.autocast`` mode (see ``ModelConfig.autocast``)."""

    NONE = "none"
    BFLOAT16 = "bfloat16"
    AUTO = "auto"


class Prediction(enum.StrEnum):
    """What the DiT's output means; :mod:`krea2.trainer.objective` turns each into v."""

    VELOCITY = "velocity"
    X0 = "x0"
    SPLIT = "split"


class InitDevice(enum.StrEnum):
    """Where the DiT is built and initialised (see ``ModelConfig.init_device``)."""

    AUTO = "auto"
    CPU = "cpu"
    META = "meta"


class Backend(enum.StrEnum):
    """The process group's backend; ``auto``: nccl on CUDA, gloo on CPU."""

    AUTO = "auto"
    GLOO = "gloo"
    NCCL = "nccl"


@functools.cache
def _enum_fields(cls: type) -> dict[str, type[enum.Enum]]:
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if isinstance(hints[f.name], type) and issubclass(hints[f.name], enum.Enum)
    }


def parse_enum_fields(obj: Any) -> None:
    """Turn the strings in ``obj``'s enum-typed fields into members, in place.

    TOML goes through ``krea2.infra.config``, which already does this; configs built in
    code may pass the plain string (``ModelConfig(autocast="auto")``). ValueError names
    the field, the choices and the closest one.
    """
    for name, kind in _enum_fields(type(obj)).items():
        value = getattr(obj, name)
        if isinstance(value, kind):
            continue
        choices = [m.value for m in kind]
        if value not in choices:
            close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.0)
            raise ValueError(
                f"{name}={value!r} is not one of {choices}; did you mean {close[0]!r}?"
            )
        setattr(obj, name, kind(value))
