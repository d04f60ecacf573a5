"""Pluggable per-row work looked up by name: concept taggers and captioners.

A stage that needs one (``Stage.plugin``) is run with a name (``krea2 curate run --tagger
shapes --captioner shapes``); the name resolves here, so the ``images`` table names only
generic handlers. Built-ins are ``module:attribute`` strings, imported on first use; add
your own with ``register_tagger`` / ``register_captioner`` (an object or such a string).
The VLM captioner of curate part 2 goes here beside ``shapes``.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import numpy as np


class Tagger(Protocol):
    """Anything that tags (h, w, 3) uint8 RGB pixels with concept names."""

    def __call__(self, pixels: np.ndarray) -> frozenset[str]: ...


class Captioner(Protocol):
    """Anything that captions one image, given its URI and its ingest metadata (the row's
    ``meta``, None if it has none): caption format → text. ``{}`` (or an exception saying
    why) when it cannot: the captions job then leaves the row to do, failed with that
    reason, rather than done with no caption."""

    def __call__(self, uri: str, meta: dict | None) -> dict[str, str]: ...


REGISTRIES: dict[str, dict[str, Any]] = {
    "tagger": {"shapes": "krea2.curate.shapes.annotate:shapes_tagger"},
    "captioner": {
        "shapes": "krea2.curate.shapes.annotate:shapes_captioner",
        "sidecar": "krea2.curate.sidecars:sidecar_captioner",
        # OCR → VLM → LLM rewrites through OpenAI-compatible servers (``captions.*``
        # settings); the captions job batches it, so this entry only names it.
        "vlm": "krea2.curate.captioning:caption_batch",
    },
}


class NoCaption(ValueError):
    """A captioner has nothing for an image (no sidecar caption, no scene). The row is
    skipped: it stays to do (a failure with this reason, not a done row with no caption)
    but is no work left for the stage (``warehouse.stage_progress``) until its inputs
    change; a re-ingest that changes its sidecars queues it again."""


# The caption format a plain string (alt text, a sidecar's "caption") is filed under.
PLAIN_CAPTION_FORMAT = "medium"


def captions_from(value: Any, where: str) -> dict[str, str]:
    """Captions as ``{format: text}`` from what a captioner or a sidecar gives: such a dict,
    a list of ``{format, text}``, a plain string (the ``PLAIN_CAPTION_FORMAT`` caption) or
    None (no captions). Formats must be the shard contract's (``CAPTION_FORMATS``); anything
    else is a ``ValueError`` naming ``where`` and the accepted forms."""
    from krea2.infra.shards import CAPTION_FORMATS

    if value is None:
        return {}
    if isinstance(value, str):
        return {PLAIN_CAPTION_FORMAT: value} if value.strip() else {}
    if isinstance(value, list) and all(
        isinstance(c, dict) and set(c) == {"format", "text"} for c in value
    ):
        value = {c["format"]: c["text"] for c in value}
    forms = (
        f'a string, {{"<format>": "<text>"}} or [{{"format": ..., "text": ...}}] with formats '
        f"from {list(CAPTION_FORMATS)}"
    )
    if not isinstance(value, dict):
        raise ValueError(f"{where}: captions must be {forms}, not {type(value).__name__}")
    for fmt, text in value.items():
        if fmt not in CAPTION_FORMATS or not isinstance(text, str) or not text.strip():
            raise ValueError(
                f"{where}: caption {fmt!r}: {text!r} is not valid; captions must be {forms}"
            )
    return dict(value)


def load_object(spec: str) -> Any:
    """The object named by ``package.module:attribute``."""
    from krea2.infra.errors import UserError

    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise UserError(f"{spec!r} must look like 'package.module:attribute'")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load {spec!r}: {exc}") from None


def register(kind: str, name: str, plugin: Any) -> None:
    """Make ``name`` resolve to ``plugin`` (an object, or a ``module:attribute`` string) in
    the ``kind`` registry (``tagger`` or ``captioner``)."""
    REGISTRIES[kind][name] = plugin


def register_tagger(name: str, tagger: Tagger | str) -> None:
    register("tagger", name, tagger)


def register_captioner(name: str, captioner: Captioner | str) -> None:
    register("captioner", name, captioner)


def check_plugin(kind: str, name: str | None, needed_by: str) -> str:
    """``name`` if the ``kind`` registry knows it; else a user error naming the fix."""
    from krea2.infra.errors import UserError

    known = sorted(REGISTRIES[kind])
    if not name or name == "none":
        raise UserError(f"the {needed_by} stage needs a {kind}: pass --{kind} NAME ({known})")
    if name not in REGISTRIES[kind]:
        raise UserError(f"--{kind} {name!r}: unknown; registered {kind}s are {known}")
    return name


def check_embedder(spec: str | None, needed_by: str) -> str:
    """``spec`` if it is a well-formed embedder spec (``KIND:PATH``); else a user error.
    Embedders are named by spec, not registered: the path is the model."""
    from krea2.curate.embed.loaders import KINDS, parse_spec
    from krea2.infra.errors import UserError

    if not spec or spec == "none":
        raise UserError(
            f"the {needed_by} stage needs an embedder: pass --embedder KIND:PATH "
            f"(KIND one of {list(KINDS)})"
        )
    parse_spec(spec)
    return spec


def check_heads(paths: str | None, needed_by: str) -> str:
    """``paths`` if it names one or more existing head files (comma-separated); else a user
    error naming the fix."""
    from pathlib import Path

    from krea2.infra.errors import UserError

    if not paths or paths == "none":
        raise UserError(
            f"the {needed_by} stage needs classifier heads: pass --heads "
            "HEAD.json[,HEAD.json] (from krea2.curate.distill.train_head)"
        )
    missing = [p for p in paths.split(",") if p and not Path(p).is_file()]
    if missing:
        raise UserError(f"--heads: no head file at {missing}")
    return paths


def plugin(kind: str, name: str) -> Any:
    """The ``kind`` plugin registered as ``name`` (imported on first use)."""
    check_plugin(kind, name, needed_by=kind)
    found = REGISTRIES[kind][name]
    if isinstance(found, str):
        found = REGISTRIES[kind][name] = load_object(found)
    return found


def tagger(name: str) -> Tagger:
    return plugin("tagger", name)


def captioner(name: str) -> Captioner:
    return plugin("captioner", name)
