"""The rows an export leaves out, by name: one vocabulary and one file (``dropped.tsv``
beside the shards) for ``krea2 train prepare`` and ``krea2 curate export``.

Light on purpose (no pixel code): ``prepare`` reads it at import, ``export`` writes with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

DROPPED_FILE = "dropped.tsv"
INCOMPLETE_BATCH = "incomplete_batch"  # a bucket's last run, shorter than a batch
UNDECODABLE = "undecodable"


def packing_losses(
    batch_size: int, dropped: Sequence[str], failed: Sequence[str]
) -> list[tuple[str, str, str]]:
    """(sample key, reason, detail) of every row an export itself left out: ``dropped`` to
    whole batches of ``batch_size``, or ``failed`` to decode (``ExportStats.dropped_keys``,
    ``failed_keys``)."""
    whole = f"batches of {batch_size}; a smaller --batch-size keeps more"
    return [(k, INCOMPLETE_BATCH, whole) for k in dropped] + [(k, UNDECODABLE, "") for k in failed]


def dropped_tsv(first: str, rows: Iterable[tuple[str, str, str]]) -> str:
    """``dropped.tsv``'s text: a header (``first``, reason, detail) and one line per row."""
    lines = [f"{first}\treason\tdetail", *("\t".join(row) for row in rows)]
    return "\n".join(lines) + "\n"
