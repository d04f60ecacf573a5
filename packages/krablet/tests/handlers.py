"""Job handlers that the worker subprocess tests load by file path."""

from __future__ import annotations

import os
import time


def square(rows):
    delay = float(os.environ.get("KRABLET_TEST_DELAY", "0"))
    if delay:
        time.sleep(delay)
    return [{"result": r["n"] * r["n"]} for r in rows]
