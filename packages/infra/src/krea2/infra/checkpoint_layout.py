"""On-disk layout of checkpoints, without torch: naming, manifests, discovery, retention.

A checkpoint of step ``s`` is the directory ``step-<s:09d>`` under the manager's root.
It is written as ``.tmp-step-<s:09d>``, fsynced, renamed into place, and only then
marked ``COMPLETE``. ``manifest.json`` lists every file with its size, so a truncated
file is detected without reading the tensors. Anything without the marker is torn and
is never loaded. A checkpoint found corrupt when a run resumes is renamed
``corrupt-step-<s:09d>-<UTC time>`` (with the reason in ``CORRUPT_REASON.txt``): kept
for inspection, invisible to discovery and retention.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from krea2.infra.errors import UserError

COMPLETE_MARKER = "COMPLETE"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d{9,})$")
TMP_PREFIX = ".tmp-step-"
CORRUPT_PREFIX = "corrupt-"
CORRUPT_REASON = "CORRUPT_REASON.txt"


class CheckpointCorruptError(RuntimeError):
    """A checkpoint directory is torn, truncated or unreadable; the message names the path."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"checkpoint {path} is corrupt: {problem}")
        self.path = path
        self.problem = problem


class CheckpointMismatchError(UserError):
    """A sound checkpoint whose tensors do not fit the state being loaded (another model
    config): a mistake to fix, not corruption, so the checkpoint is never set aside."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        shown = "; ".join(problems[:3]) + more
        super().__init__(
            f"checkpoint {path} does not fit this model: {shown}. The config differs from the "
            "one the checkpoint was saved with (e.g. patch size, width, depth); use that config"
        )
        self.path = path
        self.problems = problems


def step_dir_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:09d}"


def tmp_dir_name(step: int) -> str:
    return f"{TMP_PREFIX}{step:09d}"


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a rename is durable only once its directory is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: str) -> None:
    """Write text to ``path`` and fsync it before returning."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_manifest(directory: Path, step: int, world_size: int) -> dict:
    """Record every file's size in ``manifest.json`` (sizes are checked before loading)."""
    files = {
        p.name: p.stat().st_size
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name not in (MANIFEST, COMPLETE_MARKER)
    }
    manifest = {"step": step, "world_size": world_size, "files": files}
    write_durably(directory / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def verify_checkpoint(directory: Path) -> dict:
    """Return the manifest of a complete checkpoint, or raise CheckpointCorruptError."""
    if not (directory / COMPLETE_MARKER).is_file():
        raise CheckpointCorruptError(directory, f"no {COMPLETE_MARKER} marker (torn save)")
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointCorruptError(directory, f"unreadable {MANIFEST}: {exc}") from None
    for name, size in files.items():
        path = directory / name
        if not path.is_file():
            raise CheckpointCorruptError(directory, f"file {name} is missing")
        actual = path.stat().st_size
        if actual != size:
            raise CheckpointCorruptError(
                directory, f"file {name} has {actual} bytes, the manifest says {size} (truncated?)"
            )
    return manifest


@dataclass(frozen=True)
class CheckpointEntry:
    """One step directory found under a root."""

    step: int
    path: Path
    complete: bool
    problem: str
    size_bytes: int


def scan_checkpoints(root: str | Path) -> list[CheckpointEntry]:
    """Every ``step-*`` directory under ``root``, oldest first, with its verification result."""
    root = Path(root)
    if not root.is_dir():
        return []
    entries = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if not match or not child.is_dir():
            continue
        try:
            verify_checkpoint(child)
            complete, problem = True, ""
        except CheckpointCorruptError as exc:
            complete, problem = False, exc.problem
        size = sum(p.stat().st_size for p in child.iterdir() if p.is_file())
        entries.append(CheckpointEntry(int(match.group(1)), child, complete, problem, size))
    return sorted(entries, key=lambda e: e.step)


def set_aside_checkpoints(root: str | Path) -> list[tuple[Path, str]]:
    """The checkpoints set aside as corrupt under ``root``, oldest name first, with the
    reason recorded in each."""
    out = []
    for path in sorted(Path(root).glob(f"{CORRUPT_PREFIX}step-*")):
        reason = path / CORRUPT_REASON
        out.append((path, reason.read_text().strip() if reason.is_file() else "no reason recorded"))
    return out


def find_checkpoint_roots(path: str | Path, depth: int = 2) -> list[Path]:
    """The directories holding ``step-*`` checkpoints (or set-aside ones) at ``path`` or up
    to ``depth`` levels below it, sorted: a run directory ``runs/x`` finds each stage's
    ``runs/x/checkpoints/<stage>``."""
    path = Path(path)
    if not path.is_dir():
        return []
    if any(
        _STEP_DIR.match(c.name) or c.name.startswith(f"{CORRUPT_PREFIX}step-")
        for c in path.iterdir()
    ):
        return [path]
    if depth == 0:
        return []
    children = sorted(c for c in path.iterdir() if c.is_dir() and not c.name.startswith("."))
    return [root for c in children for root in find_checkpoint_roots(c, depth - 1)]


def steps_to_delete(
    steps: list[int], keep_last: int, keep_every: int | None, keep_offset: int = 0
) -> list[int]:
    """Retention: keep the newest ``keep_last`` steps and every step ``s`` whose
    ``s + keep_offset`` is divisible by ``keep_every``."""
    ordered = sorted(steps)
    keep = set(ordered[-keep_last:]) if keep_last > 0 else set()
    if keep_every:
        keep |= {s for s in ordered if (s + keep_offset) % keep_every == 0}
    return [s for s in ordered if s not in keep]


def set_aside(path: Path, problem: str) -> Path:
    """Rename the corrupt checkpoint ``path`` to ``corrupt-<name>-<UTC time>`` beside it,
    with ``problem`` written into it; returns the new path. Nothing scans that name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{CORRUPT_PREFIX}{path.name}-{stamp}")
    n = 1
    while target.exists():  # two set-asides of one step within a second
        target = path.with_name(f"{CORRUPT_PREFIX}{path.name}-{stamp}-{n}")
        n += 1
    path.rename(target)
    write_durably(target / CORRUPT_REASON, problem + "\n")
    fsync_path(path.parent)
    return target


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
