"""The last result of each pass (dedup, concepts, semantic, sae, balance…), kept in the
warehouse so a report, the demo or a later process reads it back instead of parsing what
``krea2 curate run`` printed.

>>> record_pass_result(wh, "semantic", {"rows": 1200, "duplicates": 85})
>>> pass_results(wh, ["semantic"])["semantic"]["result"]["duplicates"]
85
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from krea2.krablet import Table, Warehouse

PASS_RESULTS = "pass_results"


def pass_results_table() -> Table:
    """``pass_results``: one row per pass, its last run's counts (JSON) and when it ended
    (Unix time, s)."""
    from krea2.krablet import Table

    return Table(
        PASS_RESULTS, key="stage", columns={"result": "jsonb", "finished": "double precision"}
    )


def record_pass_result(wh: Warehouse, stage: str, result: Mapping[str, Any]) -> None:
    """Store ``result`` (JSON-able counts) as pass ``stage``'s last result, replacing the
    one before it; written before this returns."""
    # A round trip through JSON turns numpy scalars (a pass's counts often are) into plain
    # numbers, and fails here, naming the pass, on anything that is not JSON.
    try:
        counts = json.loads(json.dumps(dict(result), default=_plain))
    except TypeError as e:
        raise TypeError(f"pass {stage!r} returned counts that are not JSON: {e}") from None
    row = {"stage": stage, "result": counts, "finished": time.time()}
    with wh.funnel() as f:
        f.upsert(PASS_RESULTS, [row])


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # a numpy scalar
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def pass_results(wh: Warehouse, stages: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{stage: {"result": counts, "finished": unix_s}}`` for each of ``stages`` whose
    pass has run on this warehouse (a pass never run is absent)."""
    rows = wh.reader().get(PASS_RESULTS, list(stages), columns=["result", "finished"])
    return {s: {"result": rows[s]["result"], "finished": rows[s]["finished"]} for s in rows}
