"""Release one package: bump its version and its dependents' lower bounds, date its changelog.

    python3 scripts/release.py bump dit minor --dry-run   # show what would change
    python3 scripts/release.py bump dit 0.2.0             # write it
    python3 scripts/release.py check-tag krea2-dit-v0.2.0 # CI: the tag matches the tree

``bump`` refuses a release whose ``packages/<name>/CHANGELOG.md`` has nothing under
``## [Unreleased]`` (or no ``## [X.Y.Z]`` section for the new version). It then rewrites
only the lines that change: the ``version`` of ``packages/<name>/pyproject.toml``, the
``__version__`` of ``krea2/<name>/__init__.py``, the changelog heading, and the
``krea2-<name>>=...`` requirement in every package (and the umbrella project) that
depends on it; each dependent's changelog gets an Unreleased line saying so. Afterwards run
``uv lock``, commit, and push the tag it prints (that tag triggers the publish workflow).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workspace import PREFIX, ROOT, Package, dependents, load

VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
UNRELEASED = "## [Unreleased]"
TAG = re.compile(r"^krea2-(?P<name>[a-z]+)-v(?P<version>\d+\.\d+\.\d+)$")


class ReleaseError(Exception):
    """A release that must not happen; the message says why and what to do."""


def next_version(current: str, how: str) -> str:
    """``how`` is ``major``/``minor``/``patch`` or an explicit X.Y.Z greater than ``current``."""
    match = VERSION.match(current)
    if match is None:
        raise ReleaseError(f"current version {current!r} is not X.Y.Z")
    major, minor, patch = map(int, match.groups())
    if how == "major":
        return f"{major + 1}.0.0"
    if how == "minor":
        return f"{major}.{minor + 1}.0"
    if how == "patch":
        return f"{major}.{minor}.{patch + 1}"
    wanted = VERSION.match(how)
    if wanted is None:
        raise ReleaseError(f"version {how!r} is not major, minor, patch or X.Y.Z")
    if tuple(map(int, wanted.groups())) <= (major, minor, patch):
        raise ReleaseError(f"version {how} is not greater than the current {current}")
    return how


def sections(text: str) -> dict[str, str]:
    """Changelog ``## `` headings -> their bodies."""
    found: dict[str, str] = {}
    heading = None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line.strip()
            found[heading] = ""
        elif heading is not None:
            found[heading] += line + "\n"
    return found


def has_entries(body: str) -> bool:
    """True when a changelog section lists at least one change (a ``-`` or ``*`` item)."""
    return any(line.lstrip().startswith(("- ", "* ")) for line in body.splitlines())


def dated_changelog(text: str, path: Path, version: str, today: dt.date) -> str:
    """The changelog with its Unreleased entries under ``## [version] - today``.

    Raises :class:`ReleaseError` when there is no entry to release.
    """
    found = sections(text)
    existing = [h for h in found if h.startswith(f"## [{version}]")]
    if existing:
        if not has_entries(found[existing[0]]):
            raise ReleaseError(f"{path}: section {existing[0]!r} lists no changes")
        return text
    if UNRELEASED not in found or not has_entries(found[UNRELEASED]):
        raise ReleaseError(
            f"{path} has no entry for {version}: list the changes as '- ...' lines under "
            f"'{UNRELEASED}' (or under '## [{version}]') and run again"
        )
    heading = re.compile(rf"^{re.escape(UNRELEASED)}$", re.M)  # the heading, not a mention
    return heading.sub(f"{UNRELEASED}\n\n## [{version}] - {today.isoformat()}", text, count=1)


def note_unreleased(text: str, line: str) -> str:
    """Add ``line`` as the first item under Unreleased (creating the section if needed)."""
    lines = text.splitlines()
    if UNRELEASED not in lines:
        first = next((i for i, ln in enumerate(lines) if ln.startswith("## ")), len(lines))
        lines[first:first] = [UNRELEASED, ""]
    at = lines.index(UNRELEASED)
    end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    items = [ln for ln in lines[at + 1 : end] if ln.strip()]
    lines[at + 1 : end] = ["", line, *items, ""]
    return "\n".join(lines) + "\n"


def with_version(pyproject: str, path: Path, old: str, new: str) -> str:
    """The ``[project]`` table's ``version = "old"`` line set to ``new``."""
    pattern = re.compile(rf'^version = "{re.escape(old)}"$', re.M)
    if len(pattern.findall(pyproject)) != 1:
        raise ReleaseError(f'{path}: expected one line `version = "{old}"`')
    return pattern.sub(f'version = "{new}"', pyproject)


def with_lower_bound(pyproject: str, dist: str, new: str) -> str:
    """Every quoted ``"dist[extras]<spec>"`` requirement rewritten to ``"dist[extras]>=new"``."""
    pattern = re.compile(rf'"{re.escape(dist)}(\[[^\]"]*\])?(\s*[<>=!~][^";]*)?(;[^"]*)?"')
    return pattern.sub(lambda m: f'"{dist}{m.group(1) or ""}>={new}{m.group(3) or ""}"', pyproject)


def plan(root: Path, name: str, how: str, today: dt.date) -> tuple[str, dict[Path, str]]:
    """The new version and every file's new text (nothing written)."""
    packages = load(root)
    if name not in packages:
        raise ReleaseError(f"unknown package {name!r}; choose from {', '.join(packages)}")
    pkg: Package = packages[name]
    new = next_version(pkg.version, how)
    writes: dict[Path, str] = {}
    if not pkg.changelog.exists():
        raise ReleaseError(f"{pkg.changelog} does not exist: a release needs a changelog entry")
    writes[pkg.changelog] = dated_changelog(pkg.changelog.read_text(), pkg.changelog, new, today)
    writes[pkg.pyproject] = with_version(pkg.pyproject.read_text(), pkg.pyproject, pkg.version, new)
    if pkg.init.exists():
        init = pkg.init.read_text()
        line = re.compile(rf'^__version__ = "{re.escape(pkg.version)}"$', re.M)
        if line.search(init):
            writes[pkg.init] = line.sub(f'__version__ = "{new}"', init)
    dist = PREFIX + name
    note = f"- Requires `{dist}>={new}`."
    targets = [packages[d].root for d in dependents(packages, name)] + [root]
    for target in targets:
        pyproject = target / "pyproject.toml"
        text = writes.get(pyproject, pyproject.read_text())
        updated = with_lower_bound(text, dist, new)
        if updated != text:
            writes[pyproject] = updated
            changelog = target / "CHANGELOG.md"
            if changelog.exists() and target != root:
                writes[changelog] = note_unreleased(changelog.read_text(), note)
    return new, writes


def bump(root: Path, name: str, how: str, *, dry_run: bool, today: dt.date | None = None) -> str:
    """Release ``name`` at the version ``how`` asks for; print a diff; write unless ``dry_run``."""
    new, writes = plan(root, name, how, today or dt.date.today())
    for path, text in writes.items():
        old = path.read_text()
        rel = path.relative_to(root)
        sys.stdout.writelines(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"a/{rel}",
                f"b/{rel}",
            )
        )
    if dry_run:
        print(f"dry run: krea2-{name} {new}; {len(writes)} files would change, none written")
        return new
    for path, text in writes.items():
        path.write_text(text)
    print(f"krea2-{name} {new}: {len(writes)} files changed. Next: uv lock; commit; ")
    print(f"  git tag krea2-{name}-v{new} && git push origin krea2-{name}-v{new}")
    return new


def check_tag(root: Path, tag: str) -> None:
    """Fail unless ``tag`` (``krea2-<name>-vX.Y.Z``) matches the package's version and changelog."""
    match = TAG.match(tag)
    if match is None:
        raise ReleaseError(f"tag {tag!r} is not krea2-<name>-vX.Y.Z")
    packages = load(root)
    name, version = match["name"], match["version"]
    if name not in packages:
        raise ReleaseError(f"tag {tag!r} names no package; choose from {', '.join(packages)}")
    pkg = packages[name]
    if pkg.version != version:
        raise ReleaseError(f"tag {tag} but {pkg.pyproject} says version {pkg.version}")
    init = pkg.init.read_text() if pkg.init.exists() else ""
    declared = re.search(r'^__version__ = "([^"]+)"$', init, re.M)
    if declared and declared.group(1) != version:
        raise ReleaseError(f"tag {tag} but {pkg.init} says __version__ {declared.group(1)}")
    found = sections(pkg.changelog.read_text()) if pkg.changelog.exists() else {}
    if not any(h.startswith(f"## [{version}]") and has_entries(b) for h, b in found.items()):
        raise ReleaseError(f"tag {tag} but {pkg.changelog} has no '## [{version}]' entries")
    print(f"{tag}: version, __version__ and changelog agree")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="workspace root (default: repo)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_bump = sub.add_parser("bump", help="bump one package's version and its dependents' bounds")
    p_bump.add_argument("package", help="e.g. dit")
    p_bump.add_argument("version", help="major, minor, patch or X.Y.Z")
    p_bump.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    p_tag = sub.add_parser("check-tag", help="check a release tag against the tree")
    p_tag.add_argument("tag", help="krea2-<name>-vX.Y.Z")
    args = parser.parse_args(argv)
    try:
        if args.command == "bump":
            bump(args.root.resolve(), args.package, args.version, dry_run=args.dry_run)
        else:
            check_tag(args.root.resolve(), args.tag)
    except ReleaseError as exc:
        print(f"release refused: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
