"""Keep freed heap memory inside the process (glibc malloc), so hot CPU loops stop faulting.

By default glibc serves blocks over ~128 KiB-32 MiB with fresh ``mmap`` pages and hands them
back on ``free``; a training step that allocates and frees the same activations every step
then pays a page fault per 4 KiB page every step, which in a virtual machine (balloon, free
page reporting) costs as much as the arithmetic. ``keep_freed_memory`` tells malloc to
serve every block from its heaps and never trim them, so the second step reuses the first
step's pages. Peak resident memory is unchanged; it is just not returned between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

# mallopt(3) parameter numbers (glibc <malloc.h>)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

_applied = False


def keep_freed_memory(top_pad_bytes: int = 256 << 20) -> bool:
    """Serve all allocations from malloc's heaps and never trim them (idempotent).

    ``top_pad_bytes``: extra bytes the heap grows by at once (fewer ``brk`` calls).
    Returns True when applied, False where the C library is not glibc (macOS, musl).
    """
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(
        mallopt(param, value)
        for param, value in (
            (M_MMAP_MAX, 0),
            (M_TRIM_THRESHOLD, 2**31 - 1),
            (M_TOP_PAD, min(top_pad_bytes, 2**31 - 1)),
        )
    )
    if ok:
        _applied = True
        log.debug("malloc keeps freed memory (no mmap blocks, no trimming)")
    return ok
