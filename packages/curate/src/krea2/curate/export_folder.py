"""An export's output folder: the files it wrote are listed in a manifest, so the next
export into the same folder replaces them whole and never leaves a stale shard behind for
the trainer's ``*.parquet`` glob to read twice. A folder holding anything a krea2 export
did not write is refused rather than mixed with.

While an export writes, the manifest lists the previous files and the new ones together,
so an interrupted export leaves nothing the next one would take for someone else's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from krea2.infra.errors import UserError

MANIFEST = "krea2-export.json"


def _read_manifest(out_dir: Path) -> list[str]:
    path = out_dir / MANIFEST
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(
            f"{path} is not a krea2 export manifest; delete {out_dir} or choose another --out"
        ) from None
    return [str(f) for f in files]


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # never a half-written file
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_manifest(out_dir: Path, files: list[str], complete: bool) -> None:
    text = json.dumps({"files": sorted(set(files)), "complete": complete}, indent=1) + "\n"
    _write_atomically(out_dir / MANIFEST, text)


def _temporary_of(name: str, own: set[str]) -> bool:
    """Whether ``name`` is the hidden temporary file of a write of one of ``own`` that was
    killed before it could clean up (``krea2.infra.shards.write_shard``'s naming)."""
    return name.startswith(".") and name.endswith(".tmp") and name[1:].rsplit(".", 2)[0] in own


@dataclass
class ExportFolder:
    """The folder an export writes into: ``previous`` are the files the last export there
    wrote (empty for a new or empty folder); ``created``: the folder did not exist;
    ``replaced``: a previous export was there; ``removed``: its files this one did not
    write again, deleted."""

    path: Path
    previous: list[str] = field(default_factory=list)
    created: bool = False
    replaced: bool = False
    removed: int = 0

    @classmethod
    def claim(cls, out_dir: Path) -> ExportFolder:
        """The folder at ``out_dir``, after checking it holds only a previous export's files
        (a user error names the others and the fix)."""
        out_dir = Path(out_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise UserError(f"--out {out_dir} is a file; give a folder for the shards")
        if not out_dir.exists():
            return cls(out_dir, created=True)
        names = {p.name for p in out_dir.iterdir()}
        previous = _read_manifest(out_dir) if MANIFEST in names else []
        own = {MANIFEST, *previous}
        foreign = sorted(n for n in names - own if not _temporary_of(n, own | {MANIFEST}))
        if foreign:
            more = f" and {len(foreign) - 3} more" if foreign[3:] else ""
            shown = ", ".join(foreign[:3]) + more
            raise UserError(
                f"--out {out_dir} holds files no krea2 export wrote there ({shown}); the "
                "trainer would read them with the shards: choose a new or empty folder, or "
                "remove them"
            )
        return cls(out_dir, previous, replaced=bool(previous))

    def begin(self, names: list[str]) -> None:
        """Record that ``names`` are about to be written (alongside the previous files)."""
        self.path.mkdir(parents=True, exist_ok=True)
        _write_manifest(self.path, [*self.previous, *names], complete=False)

    def finish(self, names: list[str]) -> None:
        """Remove the previous files not among ``names`` (and killed writes' temporaries),
        then record ``names`` as this folder's export."""
        keep = set(names)
        own = set(self.previous) | keep | {MANIFEST}
        for p in self.path.iterdir():
            if (p.name in self.previous and p.name not in keep) or _temporary_of(p.name, own):
                p.unlink(missing_ok=True)
                self.removed += p.name in self.previous
        _write_manifest(self.path, names, complete=True)
        self.previous = list(names)

    def write(self, name: str, text: str) -> Path:
        """Write ``text`` to ``name`` in the folder, atomically: a side file of the export
        (``krea2 train prepare``'s list of dropped images), named to ``begin``."""
        path = self.path / name
        _write_atomically(path, text)
        return path

    def note(self) -> str:
        """One line on what happened to the folder."""
        if self.created:
            return f"{self.path}: a new folder"
        if not self.replaced:
            return f"{self.path}: was empty"
        stale = f" ({self.removed} of its files no longer written were removed)"
        return f"{self.path}: replaced the previous export there" + (stale if self.removed else "")
