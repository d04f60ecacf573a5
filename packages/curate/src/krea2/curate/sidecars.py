"""Sidecar files: the one caption convention of a folder of images, read the same way by
``krea2 curate ingest`` and ``krea2 train prepare``.

Beside ``<stem>.<ext>`` (webdataset / img2dataset style) an image may have:

- ``<stem>.txt``: its caption, the whole file (surrounding blank space dropped);
- ``<stem>.json``: a JSON object of metadata (source ``url``, alt text, a ShapesWorld
  ``scene``, ...: any key), which may carry captions under ``"caption"`` (a string) or
  ``"captions"`` (``{format: text}`` or ``[{format, text}]``, formats of the shard contract).

A plain caption (the ``.txt`` file, a ``"caption"`` string) is filed under
``plugins.PLAIN_CAPTION_FORMAT`` (``medium``) in the shards. Both files giving a caption is
an error naming both unless the texts are equal (so neither silently shadows the other),
as are an empty caption, both ``"caption"`` and ``"captions"``, and a key that looks like a
misspelt caption key (``"captoin"``, ``"Caption"``): metadata keys are free, so a typo there
would otherwise drop the caption without a word. The row's ``meta`` is the JSON object with
a ``.txt`` caption under ``"caption"``.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

from krea2.curate.plugins import PLAIN_CAPTION_FORMAT, NoCaption, captions_from
from krea2.infra.errors import UserError

META_SUFFIX = ".json"
CAPTION_SUFFIX = ".txt"
SIDECAR_SUFFIXES = (META_SUFFIX, CAPTION_SUFFIX)
CAPTION_KEYS = ("caption", "captions")


def sidecar_path(image: Path) -> Path:
    """Where the metadata of ``image`` lives: ``<stem>.json`` beside it."""
    return image.with_suffix(META_SUFFIX)


def caption_path(image: Path) -> Path:
    """Where the plain caption of ``image`` lives: ``<stem>.txt`` beside it."""
    return image.with_suffix(CAPTION_SUFFIX)


def _edits(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) turning ``a`` into ``b``."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def misspelt_caption_key(key: str) -> str | None:
    """The caption key ``key`` looks like a misspelling of (another case, surrounding space,
    one typo: ``captoin``, ``Caption``, ``captons``), or None. One edit, not more, so that
    metadata such as ``captioner`` stays free."""
    if key in CAPTION_KEYS:
        return None
    folded = key.strip().lower()
    return next((k for k in CAPTION_KEYS if _edits(folded, k) <= 1), None)


def _checked_captions(meta: dict, where: str) -> dict[str, str]:
    """The captions of a sidecar object; ``ValueError`` naming ``where`` for a misspelt or
    doubled caption key and for an empty caption."""
    for key in meta:
        if (meant := misspelt_caption_key(key)) is not None:
            raise ValueError(f"{where}: key {key!r} looks like a misspelt {meant!r}; rename it")
    present = [k for k in CAPTION_KEYS if k in meta]
    if len(present) == 2:
        raise ValueError(f"{where}: has both 'caption' and 'captions'; keep one")
    if not present:
        return {}
    value = meta[present[0]]
    captions = captions_from(value, where)
    if not captions:  # None, "" or only blank space, {} or []
        raise ValueError(f"{where}: {present[0]!r} is empty; write the caption or remove the key")
    return captions


def _read_json(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"sidecar {path} is not valid JSON ({e}); fix or remove it") from None
    if not isinstance(meta, dict):
        raise UserError(f"sidecar {path} must hold a JSON object, not {type(meta).__name__}")
    return meta


def read_sidecars(image: Path) -> dict | None:
    """``image``'s metadata from its sidecars (see the module docstring), None if it has
    neither. A user error names the file (or both files) for anything malformed."""
    meta_file, text_file = sidecar_path(image), caption_path(image)
    meta = _read_json(meta_file) if meta_file.is_file() else None
    try:
        captions = _checked_captions(meta, f"sidecar {meta_file}") if meta is not None else {}
    except ValueError as e:
        raise UserError(str(e)) from None
    if not text_file.is_file():
        return meta
    try:
        text = text_file.read_text().strip()
    except UnicodeDecodeError:
        raise UserError(f"caption file {text_file} is not UTF-8 text; re-save it") from None
    if not text:
        raise UserError(f"caption file {text_file} is empty; write the caption or delete it")
    if not captions:
        return (meta or {}) | {"caption": text}
    if {f: t.strip() for f, t in captions.items()} != {PLAIN_CAPTION_FORMAT: text}:
        raise UserError(
            f"{image.name} has two captions: {text_file} says {text[:60]!r}, {meta_file} "
            f"gives {captions}; keep one (delete the .txt or the caption key of the .json)"
        )
    return meta  # the same caption twice: the .json's stands


def sidecar_captions(meta: dict | None, where: str = "sidecar") -> dict[str, str]:
    """The captions a row's ``meta`` (its sidecars) carries, ``{}`` when it has none; a
    ``ValueError`` names ``where`` for malformed ones."""
    return _checked_captions(meta, where) if meta else {}


def sidecar_captioner(uri: str, meta: dict | None) -> dict[str, str]:
    """The ``sidecar`` captioner: the captions of the image's sidecars (its row's ``meta``).
    An image without any is ``NoCaption`` saying which files to write, so the captions job
    leaves its row to do (skipped) instead of marking it done with nothing."""
    captions = sidecar_captions(meta, f"metadata of {uri}")
    if captions:
        return captions
    path = Path(unquote(urlparse(uri).path)) if uri.startswith("file:") else None
    files = (
        f"{caption_path(path).name} or a 'caption' in {sidecar_path(path).name}"
        if path is not None
        else "<stem>.txt or a 'caption' in <stem>.json"
    )
    raise NoCaption(
        f"no sidecar caption for {uri}: write {files} beside it, then ingest the folder "
        "again (the captions stage picks it up)"
    )
