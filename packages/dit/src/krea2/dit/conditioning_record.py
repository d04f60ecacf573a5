"""The conditioning record: how DiT weights were trained to be sampled, stored beside them
(``krea2.dit.weights.save_weights(..., conditioning=...)``) and checked on the way in and
out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from krea2.infra.errors import UserError


def check_conditioning(record: Mapping[str, Any], where: str = "conditioning") -> dict[str, Any]:
    """A checked copy of a conditioning record: how weights were trained to be sampled.

    Keys: ``text_encoder`` (str, required): a `krea2.dit.components` text-encoder spec
    (``qwen3-vl:PATH``, ``tiny:SEED``) or a name only its writer can rebuild (e.g.
    ``trainer:words``); ``prediction`` (str, default ``"velocity"``): what the DiT output
    stands for (``velocity``, ``x0``, ``split``, ...); ``shift`` (float or None, default
    None): the fixed time shift mu, None for the resolution rule; ``text_tokens`` (int or
    None): the text length T trained with; ``autoencoder`` (str or None): the autoencoder
    spec trained with; ``sampling`` (absent, or ``{"steps": int >= 1, "cfg": float >= 0}``):
    how the weights are meant to be sampled when that differs from a guided many-step
    model's (a distilled student: its own step count, no CFG). Other keys (e.g.
    ``x0_min_t``) are kept as given. UserError (naming ``where``) on a wrong type.
    """
    out = dict(record)
    text = out.get("text_encoder")
    if not isinstance(text, str) or not text:
        raise UserError(f"{where}: 'text_encoder' must be a non-empty string, got {text!r}")
    out.setdefault("prediction", "velocity")
    if not isinstance(out["prediction"], str):
        raise UserError(f"{where}: 'prediction' must be a string, got {out['prediction']!r}")
    shift = out.setdefault("shift", None)
    if shift is not None and (isinstance(shift, bool) or not isinstance(shift, int | float)):
        raise UserError(f"{where}: 'shift' must be a number or null, got {shift!r}")
    out["shift"] = None if shift is None else float(shift)
    tokens = out.setdefault("text_tokens", None)
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise UserError(f"{where}: 'text_tokens' must be a whole number or null, got {tokens!r}")
    ae = out.setdefault("autoencoder", None)
    if ae is not None and (not isinstance(ae, str) or not ae):
        raise UserError(f"{where}: 'autoencoder' must be a non-empty string or null, got {ae!r}")
    if "sampling" in out:
        out["sampling"] = _check_sampling(out["sampling"], where)
    return out


def _check_sampling(sampling: Any, where: str) -> dict[str, Any]:
    steps = sampling.get("steps") if isinstance(sampling, dict) else None
    cfg = sampling.get("cfg") if isinstance(sampling, dict) else None
    if (
        isinstance(steps, bool)
        or not isinstance(steps, int)
        or steps < 1
        or isinstance(cfg, bool)
        or not isinstance(cfg, int | float)
        or cfg < 0
    ):
        raise UserError(
            f'{where}: \'sampling\' must be {{"steps": a whole number >= 1, "cfg": a '
            f"number >= 0}}, got {sampling!r}"
        )
    return {**sampling, "steps": steps, "cfg": float(cfg)}
