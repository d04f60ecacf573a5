"""Preference pairs in a krablet table: one row per pair with its images' URIs, its
provenance (model step, seeds, prompt, reward scores) and a person's choice.

The images stay files (written by generation); the table holds their URIs. Rows keep the
order they were added in (``seq``), which is the order ``krea2 rl annotate`` shows them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from krea2.infra.errors import UserError
from krea2.rl.preference.shards import Pair, local_path

if TYPE_CHECKING:
    from krea2.krablet import Table, Warehouse

PAIRS_TABLE = "preference_pairs"
KEY = "pair_id"
COLUMNS: dict[str, str] = {
    "prompt": "text",
    "winner_uri": "text",
    "loser_uri": "text",
    "source": "text",  # on-policy | annotation
    "model_step": "bigint",  # the step of the model that sampled both images
    "winner_seed": "bigint",
    "loser_seed": "bigint",
    "scores": "jsonb",  # {"winner": s, "loser": s, "sub": {name: [winner, loser]}}
    "choice": "text",  # winner | loser | skip; NULL: not annotated
    "annotator": "text",
    "chosen_at": "timestamptz",
    "seq": "bigint",  # insertion order (microseconds since the epoch + index)
    "reference_uri": "text",  # the style reference both images were sampled with; NULL: none
}
CHOICES = ("winner", "loser", "skip")


def pairs_table(name: str = PAIRS_TABLE) -> Table:
    """The krablet declaration of a pairs table (created or migrated by ``Warehouse.open``)."""
    from krea2.krablet import Table

    return Table(name, key=KEY, columns=COLUMNS, indexes=["seq", "choice"])


def open_pairs(cluster: str | None, name: str = PAIRS_TABLE) -> Warehouse:
    """Open (and migrate) the warehouse holding pairs table ``name``; ``cluster``: a cluster
    file or comma-separated DSNs (None: ``$KRABLET_CLUSTER``)."""
    from krea2.krablet import Warehouse, default_cluster_source

    return Warehouse.open(default_cluster_source(cluster), tables=[pairs_table(name)])


def missing_images(pairs: Sequence[Pair]) -> list[tuple[str, str, str]]:
    """(pair_id, role, uri) of every pair image that is not a readable file."""
    out = []
    for p in pairs:
        for role, uri in (("winner", p.winner_uri), ("loser", p.loser_uri)):
            if not local_path(uri).is_file():
                out.append((p.pair_id, role, uri))
    return out


def write_pairs(wh: Warehouse, pairs: Sequence[Pair], name: str = PAIRS_TABLE) -> int:
    """Upsert ``pairs`` into table ``name`` (a pair already there keeps its choice unless
    this one carries one); returns the number written. Every image must exist: a missing
    one is a UserError naming the pair, the role and the file, and nothing is written."""
    if missing := missing_images(pairs):
        pair_id, role, uri = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(
            f"pair {pair_id!r}: its {role} image {uri} does not exist{more}; "
            "nothing was written. Regenerate the pair or leave it out"
        )
    base = time.time_ns() // 1000
    chosen, open_ = [], []
    for i, p in enumerate(pairs):
        row = p.to_row() | {"seq": base + i}
        if p.choice is None:  # leave a choice already recorded in place
            open_.append({k: v for k, v in row.items() if k not in ("choice", "annotator")})
        else:
            chosen.append(row)
    with wh.funnel() as f:
        for rows in (chosen, open_):
            if rows:
                f.upsert(name, rows)
        f.flush()
    return len(pairs)


def read_pairs(wh: Warehouse, name: str = PAIRS_TABLE, annotated: bool | None = None) -> list[Pair]:
    """The pairs of table ``name`` in insertion order; ``annotated``: True only those with
    a choice, False only those without, None all."""
    where: list = []
    if annotated is not None:
        where = [("choice", "is not" if annotated else "is", None)]
    reader = wh.reader()
    cols = [KEY, *(c for c in COLUMNS if c not in ("chosen_at",))]
    rows, cursor = [], None
    while True:
        page, cursor = reader.scan(name, where=where, columns=cols, limit=10_000, cursor=cursor)
        rows += page
        if cursor is None:
            break
    rows.sort(key=lambda r: (r["seq"], r[KEY]))
    return [Pair(**{k: r[k] for k in r if k != "seq"}) for r in rows]


def set_choice(
    wh: Warehouse, pair_id: str, choice: str | None, annotator: str | None = None,
    name: str = PAIRS_TABLE,
) -> None:  # fmt: skip
    """Record a person's ``choice`` (winner | loser | skip) on a pair; None clears it (undo).
    UserError for an unknown pair or choice."""
    if choice is not None and choice not in CHOICES:
        raise UserError(f"choice {choice!r} is not one of {', '.join(CHOICES)}")
    if not wh.reader().get(name, [pair_id], columns=[KEY]):
        raise UserError(f"no pair {pair_id!r} in table {name!r}")
    from datetime import UTC, datetime

    when = datetime.now(UTC) if choice is not None else None
    who = annotator if choice is not None else None
    with wh.funnel() as f:
        f.patch(name, [{KEY: pair_id, "choice": choice, "annotator": who, "chosen_at": when}])
        f.flush()
