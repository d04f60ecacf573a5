"""Preference pairs as training shards (contract 2): a pair is two consecutive rows,
winner then loser, so the trainer's batches (runs of rows of one bucket) carry whole pairs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from krea2.infra.errors import UserError
from krea2.infra.shards import bucket_name, write_shard


@dataclass(frozen=True)
class Pair:
    """One preference pair and where it came from.

    ``winner_uri``/``loser_uri``: ``file://`` URIs (or plain paths) of PNGs;
    ``reference_uri``: the style reference image both were sampled with, if any (the
    pair then trains a style module: a stage with ``style_from``). ``source``:
    ``on-policy`` (sampled by the model at ``model_step`` with ``winner_seed``/``loser_seed``
    and ranked by a reward) or ``annotation``. ``scores``: the reward's score per branch
    (``winner``, ``loser``) and its sub-scores. ``choice``: a person's verdict, ``winner``
    (agrees), ``loser`` (flips the pair) or ``skip``; None while not annotated.
    """

    pair_id: str
    prompt: str
    winner_uri: str
    loser_uri: str
    source: str = "on-policy"
    model_step: int | None = None
    winner_seed: int | None = None
    loser_seed: int | None = None
    scores: dict = field(default_factory=dict)
    choice: str | None = None
    annotator: str | None = None
    reference_uri: str | None = None  # the style reference both images were sampled with

    def oriented(self) -> Pair | None:
        """The pair as the person chose it: swapped if they preferred the loser, None if
        they skipped it."""
        if self.choice == "skip":
            return None
        if self.choice == "loser":
            return Pair(**{**asdict(self), "winner_uri": self.loser_uri,
                           "loser_uri": self.winner_uri, "choice": "winner"})  # fmt: skip
        return self

    def to_row(self) -> dict:
        return asdict(self)


def local_path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def image_size(uri: str, pair_id: str, role: str) -> tuple[int, int]:
    """(width, height) in pixels of a pair's image, read from its header; UserError
    naming the pair, the role and the file when it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(local_path(uri)) as img:
            return img.size
    except (OSError, UnidentifiedImageError) as exc:
        why = getattr(exc, "strerror", None) or "not an image"
        raise UserError(
            f"pair {pair_id!r}: its {role} image {uri} cannot be read ({why}); "
            "regenerate the pair or delete it from the pairs table"
        ) from None


def _png(uri: str, pair_id: str, role: str, side: int, resize: bool) -> bytes:
    """The image's file bytes when it is ``side`` x ``side``; else resized (bicubic, RGB,
    re-encoded as PNG) with ``resize``, or a UserError naming the pair and its size."""
    size = image_size(uri, pair_id, role)
    path = local_path(uri)
    if size == (side, side):
        return path.read_bytes()
    if not resize:
        raise UserError(
            f"pair {pair_id!r}: its {role} image {uri} is {size[0]}x{size[1]}, not "
            f"{side}x{side} (one bucket per export); export with resize=True "
            "(krea2 rl export-pairs --resize) or leave the pair out"
        )
    import io

    from PIL import Image

    with Image.open(path) as img:
        out = img.convert("RGB").resize((side, side), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    out.save(buf, format="PNG")
    return buf.getvalue()


def export_pair_shards(
    pairs: Sequence[Pair],
    out: Path,
    side: int,
    seed: int = 0,
    pairs_per_batch: int = 8,
    resize: bool = False,
) -> list[Path]:
    """Write ``pairs`` (oriented by any human choice; skipped ones left out) as shards under
    ``out``, in the order given; returns the files. Every image must be ``side`` x ``side``
    pixels (one bucket) unless ``resize`` (then any other size is resized to it). A missing
    or unreadable image, or one of another size, is a UserError naming the pair and the
    file; nothing is written then. ``seed`` is recorded in the shard's metadata."""
    rows: list[dict] = []
    bucket = bucket_name(side, side)
    with_reference = {p.reference_uri is not None for p in pairs}
    if len(with_reference) > 1:
        raise UserError("some pairs have a style reference and some do not; export them apart")
    for pair in pairs:
        p = pair.oriented()
        if p is None:
            continue
        meta = {"pair": p.pair_id, "source": p.source, "model_step": p.model_step}
        extra = {}
        if p.reference_uri is not None:  # any size: the loader resizes it to the bucket
            image_size(p.reference_uri, p.pair_id, "reference")  # readable, or a UserError
            extra["reference"] = local_path(p.reference_uri).read_bytes()
        for role, uri, s in (("winner", p.winner_uri, p.winner_seed),
                             ("loser", p.loser_uri, p.loser_seed)):  # fmt: skip
            rows.append(
                extra
                | {
                    "key": f"{p.pair_id}/{role}",
                    "image": _png(uri, p.pair_id, role, side, resize),
                    "uri": None,
                    "crop": None,
                    "width": side,
                    "height": side,
                    "bucket": bucket,
                    "captions": [{"format": "medium", "text": p.prompt}],
                    "meta": json.dumps({**meta, "role": role, "seed": s}),
                }
            )
    if not rows:
        raise UserError("no pair to export (all skipped or none given)")
    digest = hashlib.sha1("".join(r["key"] for r in rows).encode()).hexdigest()[:8]
    path = Path(out) / f"pairs-{digest}.parquet"
    write_shard(rows, path, stage="preference", seed=seed, batch_size=2 * pairs_per_batch)
    return [path]


def read_pairs_file(path: Path) -> list[Pair]:
    """The pairs of a ``pairs.json`` (``{"pairs": [row, ...], ...}`` as the preference
    stage and ``krea2 rl make-pairs`` write it, or a bare list of rows); UserError when it
    is missing or not such a file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist (a pairs.json of krea2 rl make-pairs)")
    try:
        rows = json.loads(path.read_text())
        rows = rows["pairs"] if isinstance(rows, dict) else rows
        return [Pair(**row) for row in rows]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path} is not a pairs file ({type(exc).__name__}: {exc}); expected "
            '{"pairs": [{"pair_id", "prompt", "winner_uri", "loser_uri", ...}, ...]}'
        ) from None


def write_pairs_file(path: Path, pairs: Sequence[Pair], settings: dict | None = None) -> Path:
    """Write ``{"settings": settings, "pairs": [row, ...]}`` to ``path`` atomically (a
    temporary file renamed into place); returns ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    data = {"settings": settings or {}, "pairs": [p.to_row() for p in pairs]}
    tmp.write_text(json.dumps(data, indent=1))
    tmp.rename(path)
    return path
