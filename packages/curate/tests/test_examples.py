"""Every `Example:` of `krea2 curate --help` runs as written, in order, once its inputs exist."""

from __future__ import annotations

import shlex

import typer
from typer.testing import CliRunner

from krea2.curate.cli import app

# The examples in the order a user meets them; `photos/` (real photos) is the only input
# made beforehand; SETUP runs before an example what the examples themselves leave out.
ORDER = ["pool", "", "ingest", "run", "train-encoder", "name-clusters", "clusters", "review",
         "nearest", "report", "export", "caption-server"]  # fmt: skip
SETUP = {
    "": "krea2 curate ingest pool --name pool",
    "name-clusters": "krea2 curate run --stages embed,semantic --embedder toy:toy-encoder",
    "nearest": "krea2 curate run --stages vectors",
    "export": "krea2 curate run --stages captions --captioner shapes",
}
# An example that talks to a VLM names the usual vLLM address; the toy server stands in.
VLM_URL = "http://127.0.0.1:8000"


def _examples() -> dict[str, str]:
    """Each command's (and, under "", the group's) example line, without `Example: `."""
    group = typer.main.get_command(app)
    helps = {"": group.help or ""} | {n: c.help or "" for n, c in group.commands.items()}
    out = {}
    for name, text in helps.items():
        line = next((ln.strip() for ln in text.splitlines() if "Example:" in ln), None)
        assert line is not None, f"`krea2 curate {name}` has no Example line"
        out[name] = line.split("Example:", 1)[1].strip()
    return out


def _run(command: str) -> str:
    output = ""
    for part in command.split("&&"):
        words = shlex.split(part)
        assert words[:2] == ["krea2", "curate"], command
        result = CliRunner().invoke(app, words[2:], catch_exceptions=False)
        assert result.exit_code == 0, (command, result.output)
        output += result.output
    return output


def test_every_help_example_runs(tmp_path, cluster_file, real_photos, monkeypatch):
    examples = _examples()
    assert sorted(examples) == sorted(ORDER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KRABLET_CLUSTER", str(cluster_file))
    monkeypatch.setenv("KREA2_PROGRESS", "off")
    (tmp_path / "photos").mkdir()
    for name, data in real_photos.items():
        (tmp_path / "photos" / name).write_bytes(data)
    from krea2.curate.shapes.caption_server import start_caption_server

    server, url = start_caption_server()
    outputs = {}
    try:
        for name in ORDER:
            if name in SETUP:
                _run(SETUP[name])
            outputs[name] = _run(examples[name].replace(VLM_URL, url))
    finally:
        server.shutdown()
    assert "stages.256.max_aspect" in examples["run"]
    assert (tmp_path / "toy-encoder" / "model.safetensors").is_file()
    assert "clusters named" in outputs["name-clusters"]
    assert "pending clusters" in outputs["clusters"] and "cluster 0: recorded" in outputs["review"]
    assert outputs["nearest"].startswith("5 nearest of pool/00000-clean-00015.jpg")
    assert (tmp_path / "report" / "index.html").is_file()
    assert list((tmp_path / "shards").glob("shard-*.parquet")), outputs["export"]
