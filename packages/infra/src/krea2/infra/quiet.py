"""Two import-time notices of our dependencies, dropped at their loggers and nowhere else.

Importing transformers' or diffusers' model code imports torchao (their quantizer
registries look for it), and with the versions we pin that prints three lines before any
`krea2` command that loads a model says anything:

- torch 2.13 deprecates `register_constant()` on Enum classes, and torchao 0.18 calls it
  for its `KernelPreference` and `ScaleCalculationMode` enums: one warning per enum from
  the `torch.utils._pytree` logger. Only enums defined by torchao are dropped.
- diffusers 0.42 imports torchao tensor types (`NF4Tensor`, ...) that torchao 0.18 no
  longer has, to allow them in `torch.load`, and logs "Unable to import `torchao` Tensor
  objects" from its torchao quantizer's logger. krea2 never loads torchao-serialized
  pickles (weights are safetensors), so the notice is not about anything we do.

Each filter matches its logger and its message; every other record passes. The `krea2`
command installs them first thing, and `krea2.dit` on import (for library users).
"""

from __future__ import annotations

import logging

PYTREE_LOGGER = "torch.utils._pytree"
DIFFUSERS_TORCHAO_LOGGER = "diffusers.quantizers.torchao.torchao_quantizer"


class _TorchaoEnumConstant(logging.Filter):
    """Drops torch's deprecation of `register_constant()` for torchao's own enums."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "is an Enum subclass" not in str(record.msg) or not record.args:
            return True
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        module = getattr(args[0], "__module__", "") or ""
        return not module.startswith("torchao")


class _TorchaoTensorTypes(logging.Filter):
    """Drops diffusers' notice that torchao's (removed) tensor types cannot be imported."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unable to import `torchao` Tensor objects")


def drop_import_notices() -> None:
    """Install both filters (idempotent); cheap, so package roots call it on import."""
    for name, kind in (
        (PYTREE_LOGGER, _TorchaoEnumConstant),
        (DIFFUSERS_TORCHAO_LOGGER, _TorchaoTensorTypes),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
