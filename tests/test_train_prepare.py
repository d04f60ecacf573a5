"""``krea2 train prepare FOLDER``: curate's folder preparation as a sub-command of the
trainer's group, added by the ``krea2`` host from the ``krea2.cli.train`` entry points
(the trainer itself may not import curate)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from PIL import Image

from krea2.curate import shapes
from krea2.infra import host


def test_krea2_train_prepare_writes_shards_of_the_captioned_images(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    split = shapes.split_concepts(0)
    for i, concept in enumerate(split.train[:4]):
        scene = shapes.concept_scene(concept, "black")
        Image.fromarray(shapes.render(scene, 96, 96)).save(folder / f"img{i}.png")
        if i < 3:  # the fourth has no caption: skipped and counted
            (folder / f"img{i}.txt").write_text(shapes.captions(scene)["medium"])
    out = tmp_path / "shards"
    krea2 = Path(sys.executable).with_name("krea2")
    args = ["train", "prepare", str(folder), "--out", str(out), "--side", "64", "--min-side", "32"]
    done = subprocess.run([str(krea2), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "3 rows" in done.stdout and "without a caption: 1" in done.stdout
    table = pq.read_table(sorted(out.glob("shard-*.parquet")))
    assert table.num_rows == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([str(krea2), *args[:2], str(empty), *args[3:]], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "error:" in bad.stderr


def _plugin_module(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "grp_plugins.py").write_text(
        "def hello(name: str = 'x') -> None:\n"
        "    'Say hello.'\n"
        "    print('hello', name)\n\n"
        "def own() -> None:\n"
        "    print('not me')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_group_gains_sub_command_plugins_and_keeps_its_own(tmp_path, monkeypatch, capsys):
    _plugin_module(tmp_path, monkeypatch)
    group_eps = {
        "hello": metadata.EntryPoint("hello", "grp_plugins:hello", "krea2.cli.grp"),
        "own": metadata.EntryPoint("own", "grp_plugins:own", "krea2.cli.grp"),
        "broken": metadata.EntryPoint("broken", "no_such_module_x:f", "krea2.cli.grp"),
    }
    monkeypatch.setattr(host, "subcommand_entry_points", lambda g: group_eps if g == "grp" else {})
    app = typer.Typer()

    @app.command()
    def own() -> None:
        print("the group's own")

    @app.command()
    def other() -> None:
        print("other")

    group = host.as_click_command(app, "grp")
    host.add_subcommands(group, "grp")

    def call(*args: str) -> None:
        group.main(args=list(args), prog_name="grp", standalone_mode=False)

    call("hello", "--name", "y")
    call("own")
    out = capsys.readouterr().out
    assert "hello y" in out and "the group's own" in out and "not me" not in out
    with pytest.raises(host.PluginLoadError, match=r"'grp broken' command \(no_such_module_x:f"):
        call("broken")  # it names what failed; the group's other commands still run
    call("other")
    assert "other" in capsys.readouterr().out
