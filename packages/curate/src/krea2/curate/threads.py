"""One thread per curate worker: OpenCV and the BLAS under numpy stay on the calling thread.

Curation runs one worker process per core, so library thread pools only add contention, and
their spinning helper threads bill CPU time to the worker: with OpenBLAS's default pool the
small banded products of the Lanczos resize cost about 1.5× their single-threaded CPU time
(measured on a 2-core VM, ``benchmarks/curate.py``).
"""

from __future__ import annotations

import ctypes
import os

import cv2

# Entry points of the OpenBLAS builds that numpy and scipy wheels bundle.
_OPENBLAS_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (Linux; else none)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isfile(p))


def blas_threads(n: int) -> int:
    """Set every loaded OpenBLAS to ``n`` threads; returns how many libraries were set."""
    done = 0
    for path in _loaded_openblas():
        lib = ctypes.CDLL(path)
        setter = next((getattr(lib, s) for s in _OPENBLAS_SETTERS if hasattr(lib, s)), None)
        if setter is not None:
            setter(ctypes.c_int(n))
            done += 1
    return done


def single_threaded() -> None:
    """The setting of every curate worker process: OpenCV and BLAS on the calling thread."""
    import numpy  # noqa: F401  (loads numpy's OpenBLAS so that it can be set)

    cv2.setNumThreads(1)
    blas_threads(1)
