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

    ``winner_uri``/``loser_uri``: ``file://`` URIs (or plain paths) of PNGs. ``source``:
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


def _png(uri: str, pair_id: str, role: str) -> bytes:
    path = local_path(uri)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(
            f"pair {pair_id!r}: its {role} image {uri} cannot be read ({exc.strerror}); "
            "regenerate the pair or delete it from the pairs table"
        ) from None


def export_pair_shards(
    pairs: Sequence[Pair], out: Path, side: int, seed: int = 0, pairs_per_batch: int = 8
) -> list[Path]:
    """Write ``pairs`` (oriented by any human choice; skipped ones left out) as shards under
    ``out``; returns the files. Every image must be ``side`` x ``side`` (one bucket).
    A missing image is a UserError naming the pair and the file; nothing is written then."""
    rows: list[dict] = []
    bucket = bucket_name(side, side)
    for pair in pairs:
        p = pair.oriented()
        if p is None:
            continue
        meta = {"pair": p.pair_id, "source": p.source, "model_step": p.model_step}
        for role, uri, s in (("winner", p.winner_uri, p.winner_seed),
                             ("loser", p.loser_uri, p.loser_seed)):  # fmt: skip
            rows.append(
                {
                    "key": f"{p.pair_id}/{role}",
                    "image": _png(uri, p.pair_id, role),
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
