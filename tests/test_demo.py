"""`krea2 demo --quick` end to end: stopped in every stage, re-run to completion, checked.

This is the cross-package integration test: embedded shards, a defect-laden pool, krablet
workers running the curate DAG, Parquet export at two resolutions, the trainer, sampling,
the rubric verifier and the report, through the packages' public commands and APIs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from browser_screenshot import find_chromium, render_page
from demo_runs import DEMO, run_demo
from PIL import Image

from krea2.infra.pause import pause_env, wait_for_pause


def stop_in(out: Path, stage: str, point: str, count: int, sig: signal.Signals) -> tuple[int, str]:
    """Start the demo held at a pause point inside ``stage`` (the progress loop ``point``
    once ``count`` units are done; krea2.infra.pause), wait for the program to announce that
    it is there, then send ``sig`` to its whole process group, as a terminal's Ctrl-C does
    (workers and all). The stage is provably under way and cannot finish before the signal,
    on any machine. Returns the exit status and stderr."""
    notice = out.parent / f"{out.name}-pause-{stage}-{count}"
    notice.unlink(missing_ok=True)
    env = {**os.environ, "KREA2_PROGRESS": "plain", **pause_env(point, count, notice)}
    proc = subprocess.Popen(
        [*DEMO, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        try:
            wait_for_pause(notice, proc, timeout_s=600)
        except RuntimeError as exc:
            reader.join(10)
            pytest.fail(f"stage {stage} never reached {point}:{count} ({exc}):\n"
                        f"{''.join(lines)[-3000:]}")  # fmt: skip
        os.killpg(proc.pid, sig)
        rc = proc.wait(180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    err = "".join(lines)
    banners = re.findall(r"─ ([\w-]+): ", err)
    assert banners and banners[-1] == stage, f"paused outside stage {stage}:\n{err[-3000:]}"
    return rc, err


# (stage, the progress loop to hold, at this count, then the signal): Ctrl-C in each kind of
# stage, and SIGKILL (no chance to clean up) mid-training and mid-GDPO, so the re-runs must
# resume from records, the warehouse and checkpoints alike. "export" runs in a `krea2 curate
# export` subprocess, whose pause the notice file reports.
STOPS = [
    ("pool", "pool render", 1, signal.SIGINT),
    ("curate", "curate ocr", 1, signal.SIGINT),
    ("export-32", "export", 1, signal.SIGINT),
    ("pretrain", "train pretrain-32", 3, signal.SIGKILL),
    ("pretrain", "train pretrain-64", 2, signal.SIGINT),
    ("sample", "sample", 3, signal.SIGINT),
    ("preference-stpo", "on-policy samples", 2, signal.SIGINT),
    ("expander", "expander gdpo", 1, signal.SIGKILL),
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """A quick demo stopped in every stage in turn, then re-run to completion."""
    out = tmp_path_factory.mktemp("demo")
    curated = None
    for stage, point, count, sig in STOPS:
        rc, err = stop_in(out, stage, point, count, sig)
        if sig == signal.SIGINT:
            assert rc == 130, f"Ctrl-C in {stage} exited {rc}:\n{err[-3000:]}"
            assert err.strip().splitlines()[-1] == "interrupted", err[-3000:]
        assert not (out / "stages" / f"{stage}.json").exists(), f"{stage} recorded as done"
        if curated is None and (out / "stages" / "curate.json").exists():
            curated = json.loads((out / "stages" / "curate.json").read_text())
    assert not (out / "summary.json").exists()
    result = run_demo(out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    after = json.loads((out / "stages" / "curate.json").read_text())
    assert after == curated, "the finished curate stage was redone"
    assert "done earlier" in result.stderr
    return out


def shard_rows(out: Path) -> dict[str, list[tuple]]:
    """Every exported row, in order, per training stage: key, image digest, captions."""
    import pyarrow.parquet as pq

    rows: dict[str, list[tuple]] = {}
    for f in sorted(out.glob("shards/*/shard-*.parquet")):
        for r in pq.read_table(f, columns=["key", "image", "captions"]).to_pylist():
            digest = hashlib.sha256(r["image"]).hexdigest()
            rows.setdefault(f.parent.name, []).append((r["key"], digest, str(r["captions"])))
    return rows


@pytest.mark.timeout(1800)  # builds the stopped-and-resumed run, may wait for the plain one
def test_interrupted_runs_resume_to_exactly_the_rows_of_an_uninterrupted_run(demo, plain_demo):
    uninterrupted, record = plain_demo
    assert record["returncode"] == 0, record["stdout"] + record["stderr"]
    assert shard_rows(demo) == shard_rows(uninterrupted)
    got = json.loads((demo / "summary.json").read_text())
    want = {
        name: json.loads((uninterrupted / "stages" / f"{name}.json").read_text())["result"]
        for name in ("curate", "export-32", "export-64")
    }
    assert got["curation"]["counts"] == want["curate"]["counts"]
    exports = {k.removeprefix("export-"): v for k, v in want.items() if k != "curate"}
    assert got["export"] == {
        side: {**e, "dir": e["dir"].replace(str(uninterrupted), str(demo))}
        for side, e in exports.items()
    }


def test_summary_has_every_stage_and_curation_metrics(demo):
    summary = json.loads((demo / "summary.json").read_text())
    assert {
        "shards",
        "pool",
        "curate",
        "export-32",
        "export-64",
        "pretrain",
        "sample",
        "score",
        "preference-stpo",
        "preference-dpo",
        "rl",
        "chain",
        "turbo",
        "style",
        "expander",
    } <= set(summary["stages"])
    curation = summary["curation"]
    assert curation["images"] == summary["pool"]["images"]
    # Every one-object render is in the pool, labelled by the generator; those beyond each
    # concept's first render are scored apart from precision/recall, and byte-identical
    # re-renders are always folded.
    pool = summary["pool"]
    apart = curation["one_object_truth"]
    total = sum(sum(outcomes.values()) for outcomes in apart.values())
    assert total == pool["one_object"] - pool["one_object_by_label"]["clean"] > 0
    assert sum(apart.get("variant", {}).values()) == pool["one_object_by_label"].get("variant", 0)
    assert "kept" not in apart.get("exact_duplicate", {})
    for cls, m in curation["precision_recall"].items():
        assert m["support"] > 0, cls
        assert 0.0 <= m["precision"] <= 1.0 and 0.0 <= m["recall"] <= 1.0
    # The cheap filters and hash dedup are exact on the injected classes they own.
    for cls in ("broken", "truncated", "tiny", "flat", "exact_duplicate"):
        assert curation["precision_recall"][cls]["recall"] == 1.0, cls
    assert summary["export"]["32"]["rows"] > 0 and summary["export"]["64"]["rows"] > 0


def test_the_quick_run_says_it_is_a_smoke_run_in_summary_and_report(demo):
    note = json.loads((demo / "summary.json").read_text())["note"]
    assert note.startswith("Smoke run:") and "too few" in note
    report = (demo / "report.html").read_text()
    assert report.index("Smoke run:") < report.index("Curation funnel")


def test_shapes_eval_is_reported_for_baseline_and_each_stage(demo):
    evals = json.loads((demo / "summary.json").read_text())["shapes_eval"]
    assert list(evals) == ["untrained", "after pretrain-32", "after pretrain-64"]
    for e in evals.values():
        assert 0.0 <= e["shapes_eval"] <= 1.0
        assert {"object", "position"} <= set(e["by_kind"])
        assert len(e["prompts"]) > 0


def test_the_chain_continues_each_model_from_the_one_before(demo):
    from krea2.pipeline.chain import load_model

    chain = json.loads((demo / "summary.json").read_text())["chain"]
    assert [k for k in chain if k != "settings"] == ["pretrained", "sft", "po", "raw"]
    stages = {}
    for name in ("pretrained", "sft", "po", "raw"):
        job, index = load_model(chain[name]["model"])  # a finished stage of a trainer run
        assert (Path(job.run_dir) / "checkpoints" / f"{job.stages[index].name}.done").exists()
        stages[name] = [s.name for s in job.stages[: index + 1]]
        for key in ("cfg", "no_cfg"):
            m = chain[name][key]
            assert 0 <= m["shapes_eval"] <= 1 and 0 <= m["all_correct"] <= 1, (name, key)
            assert ("delta" in m) == (name != "pretrained"), (name, key)
    # each chain model's run holds the model before it as its previous stage
    assert stages["sft"] == [*stages["pretrained"], "sft"]
    po_more = stages["po"][len(stages["sft"]) :]
    assert stages["po"][: len(stages["sft"])] == stages["sft"] and po_more in ([], ["preference"])
    assert stages["raw"][: len(stages["po"])] == stages["po"]
    section = (demo / "report.html").read_text().split("<h2>The chain")[1].split("<h2>")[0]
    assert all(f"<td>{name}</td>" in section for name in ("pretrained", "sft", "po", "raw"))
    # measured on the samples the preference and RL stages drew the same way, not drawn again
    record = {n: json.loads((demo / "stages" / f"{n}.json").read_text())["result"]
              for n in ("chain", "preference-stpo", "rl")}  # fmt: skip
    models, pref, rl = record["chain"]["models"], record["preference-stpo"], record["rl"]
    assert models["sft"]["cfg"]["samples"] == pref["pretrained_samples"]
    assert models["po"]["cfg"]["samples"] == pref["samples"] == rl["pretrained"]["cfg"]["samples"]
    assert models["raw"]["no_cfg"]["samples"] == rl["tuned"]["no_cfg"]["samples"]


def test_turbo_is_raw_distilled_and_measured_against_raw_at_each_step_count(demo):
    from krea2.pipeline.chain import load_model

    summary = json.loads((demo / "summary.json").read_text())
    turbo, chain = summary["turbo"], summary["chain"]
    job, index = load_model(turbo["model"])  # a finished tdm stage whose start is raw
    assert job.stages[index].objective == "tdm" and job.stages[index].name == "turbo"
    raw_job, raw_index = load_model(chain["raw"]["model"])
    assert job.stages[index - 1].name == raw_job.stages[raw_index].name
    assert (Path(job.run_dir) / "checkpoints" / "turbo.done").exists()
    st = chain["settings"]
    m = turbo["measures"]
    # the teacher at [eval]'s steps is the chain's raw, its samples reused where they were
    # drawn alike (the quick recipe distils from [eval]'s CFG), not redrawn
    full = m[turbo["keys"]["teacher"]]
    assert (full["steps"], full["cfg"]) == (st["steps"], st["cfg"])
    assert full["shapes_eval"] == chain["raw"]["cfg"]["shapes_eval"]
    assert m[f"teacher-{st['steps']}"]["shapes_eval"] == chain["raw"]["no_cfg"]["shapes_eval"]
    students = sorted(v["steps"] for v in m.values() if v["who"] == "student")
    teachers = sorted({v["steps"] for v in m.values() if v["who"] == "teacher"})
    assert 4 in students and teachers == sorted({*students, st["steps"]})
    for v in m.values():
        assert 0 <= v["shapes_eval"] <= 1 and 0 <= v["saturation"] <= 1
        assert set(v["spread"]) == {"position", "size", "background"}
    assert all(d["se"] >= 0 for d in turbo["deltas"].values())
    assert {"quality", "beats_fewer_teacher_steps", "no_collapse", "speed_vs_cfg"} <= set(
        turbo["checks"]
    )
    assert turbo["speed"]["student_s_per_image"] > 0
    section = (demo / "report.html").read_text().split("<h2>Turbo")[1].split("<h2>")[0]
    assert "ShapesEval against sampling steps" in section and "<td>student</td>" in section
    assert section.count("data:image/png") >= 8 * (len(students) + 2)  # the sample grid


def test_the_preference_stages_report_stpo_and_the_dpo_ablation(demo):
    preference = json.loads((demo / "summary.json").read_text())["preference"]
    assert list(preference) == ["stpo", "dpo"]
    for kind, p in preference.items():
        assert 0.0 <= p["pretrained"]["shapes_eval"] <= 1.0, kind
        assert p["pairs"] == preference["stpo"]["pairs"], "both objectives share the pairs"
        if p["pairs"]:
            assert p["gaps"] is not None and p["hf_energy_ratio"] > 0, kind
        else:  # the smoke run's model is usually too weak to rank its samples
            assert p["gaps"] is None and "no preference pair" in p["note"], kind
    report = (demo / "report.html").read_text()
    start = report.index("<h2>Preference optimization</h2>")
    assert report.index("ShapesEval on held-out prompts") < start
    section = report[start:]
    assert "<td>pretrained</td>" in section and "<th>pretrained</th>" in section
    for kind, p in preference.items():
        if p["pairs"]:
            assert "Likelihood gaps during training" in section
            assert f"<th>{kind.upper()}</th>" in section  # its row of samples
        else:
            assert f"{kind.upper()}: no preference pair" in section


def test_the_expander_stage_reports_sft_gdpo_and_the_ablation(demo):
    expander = json.loads((demo / "summary.json").read_text())["expander"]
    assert {"raw", "sft", "gdpo", "gdpo-no-diversity"} <= set(expander)
    assert expander["requests"] > 0 and expander["sft_examples"] > 0
    for name in ("sft", "gdpo", "gdpo-no-diversity"):
        m = expander[name]
        assert 0.0 <= m["faithful"] <= 1.0 and 0.0 <= m["shapes_eval"] <= 1.0, name
        assert m["diversity"] >= 0.0, name
    assert set(expander["last_rewards"]) == {"gdpo", "gdpo-no-diversity"}
    assert "diversity" in expander["last_rewards"]["gdpo-no-diversity"]  # logged, weighed 0
    assert "artifact" in expander["last_rewards"]["gdpo"]  # the recipe's artifact_weight
    # Killed during GDPO (STOPS), then resumed to complete results and models.
    for name in ("sft", "gdpo", "gdpo-no-diversity"):
        assert list((demo / "expander" / name).glob("*.safetensors")), name
    section = (demo / "report.html").read_text().split("<h2>Prompt expander</h2>")[1]
    assert "raw short requests" in section and "GDPO without the diversity reward" in section
    assert "GDPO reward: diversity" in section and "Expansions (greedy)" in section


def test_rows_survive_the_kill(demo):
    pool = json.loads((demo / "stages" / "pool.json").read_text())["result"]
    curated = json.loads((demo / "stages" / "curate.json").read_text())["result"]
    assert sum(curated["counts"].values()) == pool["images"]


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")
def test_report_renders_in_headless_chromium(demo):
    rendering = render_page(demo / "report.html", demo / "report.png", width=1100, height=1600)
    shot = np.asarray(Image.open(rendering.screenshot).convert("RGB"))
    assert shot.std() > 5
    headings = ("Curation funnel", "ShapesEval on held-out prompts", "Training loss")
    for heading in (*headings, "Preference optimization"):
        assert heading in rendering.dom


def test_style_variants_train_on_raw_and_are_measured(demo):
    import torch

    from krea2.dit import load_style_module
    from krea2.trainer import stage_style_path

    style = json.loads((demo / "summary.json").read_text())["style"]
    assert {"none", "R", "S", "O", "strength", "mixing", "checks"} <= set(style)
    for key in ("none", "R", "S", "O"):
        m = style[key]["mean"]
        assert 0 <= m["similarity"] <= 1 and 0 <= m["leaked"] <= 1 and 0 <= m["content"] <= 1
    for key in ("R", "S", "O"):
        d = style[key]["vs_none"]["content"]
        assert d["se"] >= 0
        module = load_style_module(stage_style_path(demo / "style" / f"variant-{key}", "style"))
        assert module.cfg.tokens == 4
    # s = 0 removes the reference exactly: the same pixels as raw without one
    assert style["strength"]["sweep"]["0.0"]["identical_to_none"] == 1.0
    assert {"leakage", "style", "content", "strength", "mixing"} <= set(style["checks"])
    # S aligned by STPO on its own pairs (stage style-po in S's run): paired with S
    aligned = style["S+PO"]
    assert aligned["pairs"]["pairs"] >= 2 and set(aligned["vs_S"]) >= {"similarity", "content"}
    assert "alignment" in style["checks"]
    before = load_style_module(stage_style_path(demo / "style" / "variant-S", "style"))
    after = load_style_module(stage_style_path(demo / "style" / "variant-S", "style-po"))
    moved = [
        not torch.equal(a, b)
        for a, b in zip(before.state_dict().values(), after.state_dict().values(), strict=True)
    ]
    assert any(moved)  # fmt: skip
    section = (demo / "report.html").read_text().split("<h2>Style reference")[1].split("<h2>")[0]
    assert "S: self-supervised" in section and "Held-out references" in section
    assert "S after STPO" in section
