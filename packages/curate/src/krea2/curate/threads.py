"""One thread per curate worker: OpenCV and the BLAS under numpy and scipy stay on the calling
thread.

Curation runs one worker process per core, so library thread pools only add contention, and
their spinning helper threads bill CPU time to the worker: with OpenBLAS's default pool the
small banded products of the Lanczos resize cost about 1.5× their single-threaded CPU time
(measured on a 2-core VM, ``benchmarks/curate.py``).
"""

from __future__ import annotations

import cv2
from threadpoolctl import threadpool_info, threadpool_limits


def single_threaded() -> None:
    """The setting of every curate worker process, for the rest of the process's life."""
    import numpy  # noqa: F401  (loads numpy's BLAS so that its pool is found and limited)

    cv2.setNumThreads(1)
    # BLAS only: an OpenMP pool in the same process may be torch's, which sets its own.
    threadpool_limits(limits=1, user_api="blas")


def pool_threads() -> dict[str, int]:
    """Threads of every native thread pool loaded in this process, by library (``blas``,
    ``openmp``) and OpenCV's (``opencv``)."""
    out = {"opencv": cv2.getNumThreads()}
    for pool in threadpool_info():
        out[pool["user_api"]] = max(out.get(pool["user_api"], 0), pool["num_threads"])
    return out
