"""Every shell command in the docs runs as written.

Each ```bash (or ```sh) block of README.md, docs/**/*.md and packages/*/README.md runs, in
document order, in one fresh directory per document where the repository's ``configs/``,
``tests/``, ``packages/`` and ``benchmarks/`` are linked, with this environment's ``krea2``
first on PATH; a later block may use what an earlier one wrote. A block that cannot run
here says why on the line above its fence::

    <!-- docs-test: skip (needs real weights) -->

Commands also hide in unlabelled fences; those are refused, so a doc cannot dodge the test
by dropping the language tag.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# docs/ holds reference pages, design notes under docs/design/ and the generated
# dated results: every page counts.
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("packages/*/README.md")])
LINKED = ("configs", "tests", "packages", "benchmarks")
SHELL = {"bash", "sh", "shell"}
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<why>[^)]+)\)\s*-->")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
# A line of an unlabelled block that reads as a command someone would type.
COMMAND_LINE = re.compile(
    r"^\s*(\$ |krea2 |uv (run|sync|pip)|pip install |python -m )(?!.*[│┌└├─])"  # not a diagram
)
BLOCK_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (1-based line), its language and text."""

    doc: Path
    line: int
    lang: str
    code: str
    skip: str | None  # the reason given on the line above the fence, if any


def fenced_blocks(doc: Path) -> list[Block]:
    lines = doc.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang, body = i, m["lang"].lower(), []
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        above = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.search(above)
        blocks.append(
            Block(doc, start + 1, lang, "\n".join(body), skip["why"].strip() if skip else None)
        )
        i += 1  # the closing fence
    return blocks


def shell_blocks(doc: Path) -> list[Block]:
    return [b for b in fenced_blocks(doc) if b.lang in SHELL]


def label(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def test_commands_are_in_shell_fences():
    """An unlabelled fence holding commands would escape the run below."""
    hidden = [
        f"{label(b.doc)}:{b.line}: {line.strip()}"
        for doc in DOCS
        for b in fenced_blocks(doc)
        if b.lang == ""
        for line in b.code.splitlines()
        if COMMAND_LINE.match(line)
    ]
    assert not hidden, "commands in an unlabelled fence (tag it ```bash):\n" + "\n".join(hidden)


# docs/lora.md, the first-time walkthrough, runs in the default set (its own test below).
LORA_PAGE = ROOT / "docs" / "lora.md"
RUNNABLE = [d for d in DOCS if any(b.skip is None for b in shell_blocks(d)) and d != LORA_PAGE]


@pytest.mark.slow  # ~4 min on 2 cores: `uv run pytest -m slow`
@pytest.mark.parametrize("doc", RUNNABLE, ids=label)
def test_doc_commands_run(doc: Path, tmp_path: Path) -> None:
    run_doc(doc, tmp_path)


def test_your_images_to_a_lora_runs_end_to_end(tmp_path: Path) -> None:
    """docs/lora.md on real photos and the tiny model folder (about 2 min on 2 cores): the
    near-duplicate is named, the stopped run resumes and extends, samples and plots are
    written, and the exported LoRA loads, samples and unloads in diffusers."""
    outputs = run_doc(LORA_PAGE, tmp_path)
    dropped = (tmp_path / "shards" / "mine-64" / "dropped.tsv").read_text()
    assert "copy-of-00.jpg\tnear_duplicate" in dropped, dropped
    assert (tmp_path / "samples" / "grid.png").is_file()
    assert (tmp_path / "lora-tiny.safetensors").is_file()
    assert any((tmp_path / "lora-tiny").glob("*.safetensors"))
    assert "loaded, sampled and unloaded the LoRA: (64, 64)" in outputs
    assert (tmp_path / "lora.png").is_file()
    metrics = (tmp_path / "runs" / "lora-tiny" / "metrics.jsonl").read_text()
    assert '"step": 59' in metrics  # extended from 40 to 60 steps


def run_doc(doc: Path, tmp_path: Path) -> str:
    """Run every runnable shell block of ``doc`` in order in ``tmp_path`` (the repository's
    folders linked in); returns their outputs (each cut to its last 4000 characters)."""
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
        "KREA2_PROGRESS": "plain",
    }
    outputs = []
    try:
        for block in shell_blocks(doc):
            if block.skip is not None:
                continue
            rc, out = run_block(block, tmp_path, env)
            assert rc == 0, f"{label(doc)}:{block.line} exited {rc}\n$ {block.code}\n{out}"
            outputs.append(out)
    finally:
        stop_embedded_shards(tmp_path, env)
    return "\n".join(outputs)


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run one block in its own process group; whatever it left running (a server started
    with ``&``) or a block past its time limit is killed with the group."""
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=BLOCK_TIMEOUT_S)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc, out = -1, f"(still running after {BLOCK_TIMEOUT_S} s)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return rc, out[-4000:]


def stop_embedded_shards(directory: Path, env: dict[str, str]) -> None:
    """A failed block must not leave PostgreSQL running: stop every warehouse under
    ``directory`` (the blocks put theirs there)."""
    for parent, _, files in os.walk(directory):  # not into the linked repository folders
        if "cluster.json" not in files:
            continue
        subprocess.run(
            ["krea2", "krablet", "down", "--data", parent],
            cwd=directory,
            env=env,
            capture_output=True,
            timeout=120,
        )


def test_fences_are_parsed_with_their_skip_reasons(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n\n<!-- docs-test: skip (needs real weights) -->\n```bash\nkrea2 a\n```\n\n"
        "```bash\nkrea2 b\n```\n```\ntree/\n```\n"
    )
    got = [(b.line, b.lang, b.code, b.skip) for b in fenced_blocks(doc)]
    assert got == [
        (4, "bash", "krea2 a", "needs real weights"),
        (8, "bash", "krea2 b", None),
        (11, "", "tree/", None),
    ]


LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")
REPO_PATH = re.compile(
    r"(?<![\w./-])(?P<path>(?:docs|configs|benchmarks|tests|packages|src)/[\w./-]+)"
)


def test_docs_name_only_files_that_exist():
    """A doc that points at a file the repository does not have misleads its reader."""
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in LINK.finditer(text):
            target = m["target"]
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                missing.append(f"{label(doc)}: link {target}")
        for m in REPO_PATH.finditer(text):
            path = m["path"].rstrip(".")
            if not (ROOT / path).exists():
                missing.append(f"{label(doc)}: {path}")
    assert not missing, "docs name files that are not in the repository:\n" + "\n".join(missing)
