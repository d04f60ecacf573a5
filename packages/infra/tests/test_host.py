"""The krea2 CLI host: plugin discovery, --version, broken plugins, user errors."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import click.testing
import pytest
import typer
from typer.testing import CliRunner

from krea2.infra import host
from krea2.infra.errors import UserError

runner = CliRunner()


def run_krea2(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from krea2.infra.host import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_lists_installed_subcommands_without_importing_them():
    result = run_krea2("--help")
    assert result.returncode == 0, result.stderr
    for name in host.plugin_entry_points():
        assert name in result.stdout
    assert "infra" in result.stdout


def test_version_lists_krea2_distributions():
    result = run_krea2("--version")
    assert result.returncode == 0
    assert f"krea2-infra {metadata.version('krea2-infra')}" in result.stdout.splitlines()


def test_subcommand_help_loads_the_plugin():
    result = run_krea2("infra", "--help")
    assert result.returncode == 0, result.stderr
    assert "checkpoints" in result.stdout


def fake_entry_point(name: str, value: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=value, group=host.ENTRY_POINT_GROUP)


def test_broken_plugin_prints_one_line_and_leaves_others_working(monkeypatch, capsys):
    real = host.plugin_entry_points()
    broken = fake_entry_point("broken", "krea2_no_such_module.cli:app")
    monkeypatch.setattr(host, "plugin_entry_points", lambda: {**real, "broken": broken})
    listing = runner.invoke(host.app, ["--help"])
    assert listing.exit_code == 0
    assert "broken" in listing.output
    assert host.run_cli(host.app, ["broken"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1
    assert "'broken'" in lines[0]
    assert "krea2_no_such_module" in lines[0]
    assert runner.invoke(host.app, ["infra", "--help"]).exit_code == 0


def test_plain_function_plugins_become_single_commands():
    def hello(name: str = "world") -> None:
        """Say hello."""
        typer.echo(f"hello {name}")

    command = host.as_click_command(hello, "hello")
    result = click.testing.CliRunner().invoke(command, ["--name", "krea"])
    assert result.output.strip() == "hello krea"


def test_user_error_becomes_one_error_line_and_exit_2(capsys):
    app = typer.Typer()

    @app.command()
    def fail() -> None:
        raise UserError("batch size 0 must be positive; set --batch-size 64")

    assert host.run_cli(app, []) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: batch size 0 must be positive; set --batch-size 64"


@pytest.mark.parametrize("bad", [42, "text"])
def test_non_command_entry_point_objects_are_rejected(bad):
    with pytest.raises(TypeError, match="not a typer app"):
        host.as_click_command(bad, "x")


# A tiny CLI run through the real host in a subprocess: usage errors and Ctrl-C must
# behave the same whatever copy of click (click's or typer's vendored one) raises.
_TOY_CLI = """
import os, signal, sys, time
import typer
from krea2.infra.host import run_cli

app = typer.Typer()

@app.command()
def up(data: str = typer.Option(..., "--data")) -> None:
    print("up", data)

@app.command()
def wait() -> None:
    # a signal to itself, delivered before kill() returns: its KeyboardInterrupt comes in or
    # right after the sleep (the work it stands for), never after the print: no race
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    print("not interrupted")

@app.command()
def term() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # as wait(): delivered before the print, no race
    time.sleep(5)
    print("not terminated")

sys.exit(run_cli(app, sys.argv[1:]))
"""


def run_toy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _TOY_CLI, *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["up"], "Missing option '--data'"),
        (["up", "--dta", "x"], "No such option: --dta"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
)
def test_usage_errors_are_one_line_with_usage_and_exit_2(args, message):
    result = run_toy(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert result.stderr.lstrip().startswith("Usage:")
    assert len(result.stderr.strip().splitlines()) <= 4


def test_ctrl_c_exits_130_and_says_interrupted():
    result = run_toy("wait")
    assert result.returncode == 130, (result.stdout, result.stderr)
    assert "not interrupted" not in result.stdout
    assert result.stderr.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in result.stderr


def test_sigterm_stops_a_command_as_ctrl_c_does_and_exits_143():
    result = run_toy("term")
    assert result.returncode == 143, (result.stdout, result.stderr)
    assert "not terminated" not in result.stdout
    assert result.stderr.strip().splitlines()[-1] == "terminated"
    assert "Traceback" not in result.stderr


def test_ctrl_c_in_a_plain_click_command_exits_130(capsys):
    @click.command()
    def wait() -> None:
        raise KeyboardInterrupt

    assert host.run_cli(wait, []) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_function_command_is_listed_by_its_docstring_without_import(tmp_path, monkeypatch):
    (tmp_path / "toyplugin_cmd.py").write_text(
        'raise RuntimeError("imported")\n\n'
        "def demo():\n"
        '    """Run the toy pipeline end to end.\n\n    Example: krea2 demo\n    """\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = metadata.EntryPoint("demo", "toyplugin_cmd:demo", host.ENTRY_POINT_GROUP)
    assert host._summary(ep) == "Run the toy pipeline end to end."
    app_ep = metadata.EntryPoint("x", "toyplugin_cmd:app", host.ENTRY_POINT_GROUP)
    assert host._summary(app_ep) == ""  # not a function, no distribution: no summary
