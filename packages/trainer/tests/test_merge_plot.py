"""PMA and checkpoint merging from disk, and `krea2 train plot`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from krea2.infra.errors import UserError
from krea2.trainer.cli import app, run_job
from krea2.trainer.merge import average, merge_to_file, pma_from_run, pma_steps
from krea2.trainer.observe import read_metrics


@pytest.fixture(scope="module")
def run(tmp_path_factory, shards):
    from trainer_test_helpers import job_toml

    root = tmp_path_factory.mktemp("pma")
    job = root / "job.toml"
    job.write_text(job_toml(root / "run", shards, steps=9))
    run_job(job, [], resume=False)
    return root / "run"


def test_pma_averages_the_last_n_checkpoints_taken_every_k_steps(run, tmp_path):
    root = run / "checkpoints" / "pretrain"
    assert pma_steps(root, 2, 3) == [5, 8]
    out = tmp_path / "pma.safetensors"
    assert pma_from_run(run, "pretrain", 2, 3, out) == [5, 8]
    a, b = average([root / "step-000000005"]), average([root / "step-000000008"])
    merged = load_file(str(out))
    assert set(merged) == set(a)
    for k in a:
        assert torch.allclose(merged[k].float(), (a[k] + b[k]) / 2, atol=1e-6)
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the inputs really differ


def test_pma_wants_enough_checkpoints(run):
    with pytest.raises(UserError, match=r"PMA wants 5 checkpoints every 3"):
        pma_steps(run / "checkpoints" / "pretrain", 5, 3)


def test_weighted_merge_of_released_weights_loads_back_into_the_dit(run, tmp_path):
    from krea2.dit.model import Krea2DiT
    from krea2.dit.weights import load_weights
    from krea2.trainer.build import dit_config
    from krea2.trainer.config import load_job

    root = run / "checkpoints" / "pretrain"
    first, last = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    merge_to_file([root / "step-000000002"], None, run / "config.toml", first)
    merge_to_file([root / "step-000000008"], None, run / "config.toml", last)
    out = merge_to_file([first, last], [1.0, 3.0], run / "config.toml", tmp_path / "m.safetensors")
    fa, fb, fm = load_file(str(first)), load_file(str(last)), load_file(str(out))
    for k in fa:
        assert torch.allclose(fm[k], 0.25 * fa[k] + 0.75 * fb[k], atol=1e-6)
    model = Krea2DiT(dit_config(load_job(run / "config.toml")))
    load_weights(model, str(out))
    with pytest.raises(UserError, match="weights"):
        merge_to_file([first, last], [1.0], run / "config.toml", tmp_path / "x.safetensors")


def test_plot_writes_png_and_html(run, tmp_path):
    result = CliRunner().invoke(app, ["plot", str(run), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    png, html = tmp_path / "c.png", tmp_path / "c.html"
    assert png.read_bytes()[:4] == b"\x89PNG" and "<img" in html.read_text()


def test_plot_into_a_folder_writes_curves_there(run, tmp_path):
    """``--out plots/`` (or an existing folder) means a folder, as the default RUN/curves."""
    result = CliRunner().invoke(app, ["plot", str(run), "--out", f"{tmp_path / 'plots'}/"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "plots" / "curves.png").is_file()
    assert (tmp_path / "plots" / "curves.html").is_file()
    assert not (tmp_path / "plots.png").exists()


def test_metrics_reader_keeps_the_last_row_of_a_replayed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"kind": "train", "stage": "a", "step": 0, "loss": 3.0},
        {"kind": "train", "stage": "a", "step": 1, "loss": 2.0},
        {"kind": "train", "stage": "a", "step": 1, "loss": 1.5},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"kind": "tra')
    assert [r["loss"] for r in read_metrics(path)] == [3.0, 1.5]


def test_plot_says_why_a_panel_is_empty_and_shows_grids_under_their_prompts(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np

    from krea2.trainer.evaluate import save_grid

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"kind": "train", "stage": "a", "step": s, "loss": 2.0 - 0.1 * s} for s in range(5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    images = np.zeros((2, 1, 8, 8, 3), dtype=np.uint8)
    save_grid(images, ["blob 1 in cell 2", "blob <7>"], run / "samples" / "a-000004.png")
    krea2 = str(Path(sys.executable).parent / "krea2")
    result = subprocess.run([krea2, "train", "plot", str(run)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    page = (run / "curves.html").read_text()
    assert "held-out loss: no held-out set: no stage has eval_data" in page
    assert "iREPA loss: iREPA was off" in page
    assert "<li>blob 1 in cell 2</li>" in page and "<li>blob &lt;7&gt;</li>" in page


def test_keep_every_keeps_the_checkpoints_pma_every_asks_for(write_job, tmp_path):
    job = write_job("keep", steps=9)
    run_job(job, ["checkpoint.keep_last=1", "checkpoint.keep_every=3"], resume=False)
    assert pma_steps(tmp_path / "keep" / "checkpoints" / "pretrain", 3, 3) == [2, 5, 8]


def test_ties_trims_elects_signs_and_averages_the_agreeing_entries(tmp_path):
    from safetensors.torch import save_file

    from krea2.trainer.merge import ties_merge

    base = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    tau_a = torch.tensor([3.0, 1.0, -2.0, 0.1, 4.0, 0.0])
    tau_b = torch.tensor([1.0, -5.0, -2.0, -0.2, 0.0, 0.0])
    paths = []
    for name, t in (("base", base), ("a", base + tau_a), ("b", base + tau_b)):
        save_file({"w": t.clone()}, str(tmp_path / f"{name}.safetensors"))
        paths.append(tmp_path / f"{name}.safetensors")
    full = ties_merge(paths[0], paths[1:], density=1.0)["w"]
    # signs: + (3+1), - (1-5), - , - (0.1-0.2), + , none; agreeing entries averaged
    assert torch.allclose(full - base, torch.tensor([2.0, -5.0, -2.0, -0.2, 4.0, 0.0]))
    half = ties_merge(paths[0], paths[1:], density=0.5)["w"]
    # a keeps 3, -2, 4; b keeps 1, -5, -2: the small entries (0.1, -0.2) are trimmed
    assert torch.allclose(half - base, torch.tensor([2.0, -5.0, -2.0, 0.0, 4.0, 0.0]))
    weighted = ties_merge(paths[0], paths[1:], weights=[3.0, 1.0], density=1.0)["w"]
    assert torch.allclose(weighted[0] - 1.0, torch.tensor(2.5))  # (3*3 + 1*1) / 4


def test_task_arithmetic_adds_each_task_vector_whole(tmp_path):
    from safetensors.torch import save_file

    from krea2.infra.errors import UserError
    from krea2.trainer.merge import average, task_arithmetic

    base = torch.tensor([1.0, 1.0, 1.0, 1.0])
    tau_a = torch.tensor([2.0, 0.0, -1.0, 0.0])  # domain A changes entries 0 and 2
    tau_b = torch.tensor([0.0, 3.0, -1.0, 0.0])  # domain B changes entries 1 and 2
    paths = []
    for name, t in (("base", base), ("a", base + tau_a), ("b", base + tau_b)):
        save_file({"w": t.clone()}, str(tmp_path / f"{name}.safetensors"))
        paths.append(tmp_path / f"{name}.safetensors")
    merged = task_arithmetic(paths[0], paths[1:])["w"]
    assert torch.allclose(merged, base + tau_a + tau_b)  # each domain's change whole
    # averaging halves what only one source changed
    assert torch.allclose(average(paths[1:])["w"], base + (tau_a + tau_b) / 2)
    scaled = task_arithmetic(paths[0], paths[1:], weights=[1.0, 0.5], scale=0.5)["w"]
    assert torch.allclose(scaled, base + 0.5 * (tau_a + 0.5 * tau_b))
    with pytest.raises(UserError, match="2 numbers"):
        task_arithmetic(paths[0], paths[1:], weights=[1.0])
