"""The demo's preference stages in the recipe, the report section and summary.json, on
results shaped as ``krea2.rl.preference.preference_stage`` returns them (no training)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from krea2.infra import ConfigError
from krea2.pipeline import html, preference, report
from krea2.pipeline.config import load_demo_config, recipe_text

PROMPTS = [f"A red circle in cell {i}, on a plain black background." for i in range(10)]
NOTE = "no preference pair: the reward scored all samples of each of the 16 prompts alike"


def measures(shapes_eval: float, artifact: float, hf: float) -> dict:
    by_kind = {"object": shapes_eval, "position": shapes_eval, "count": 1.0, "total": 1.0}
    return {
        "shapes_eval": shapes_eval,
        "by_kind": by_kind,
        "all_correct": shapes_eval / 2,
        "reward": shapes_eval + 0.5 * artifact,
        "artifact": artifact,
        "hf_energy": hf,
    }


def samples(path: Path, seed: int) -> str:
    """Eval images uint8 [P=10, S=3, 64, 64, 3] saved as ``.npy``; returns the path."""
    rng = np.random.default_rng(seed)
    np.save(path, rng.integers(0, 255, (len(PROMPTS), 3, 64, 64, 3), dtype=np.uint8))
    return str(path)


def trained(tmp_path: Path, kind: str, winner_end: float, winner_max: float) -> dict:
    """A result of a trained objective: 30 logged steps (every 5 of 150)."""
    steps = list(range(0, 150, 5))
    ramp = np.linspace(0, 1, len(steps))
    winner = list(winner_max * np.sin(np.pi * ramp) + winner_end * ramp)
    return {
        "objective": kind,
        "pairs": 35,
        "batch_size": 16,
        "curves": {
            "step": [float(s) for s in steps],
            "loss": list(0.7 - 0.5 * ramp),
            "winner_gap": winner,
            "loser_gap": list(0.09 * ramp + 0.0014),
            "margin": list(0.09 * ramp),
            "accuracy": list(np.minimum(1.0, 0.5 + ramp)),
        },
        "pretrained": measures(0.765, 0.105, 0.02),
        "tuned": measures(0.807 if kind == "stpo" else 0.673, 0.15, 0.03),
        "hf_energy_ratio": 1.542 if kind == "stpo" else 3.399,
        "samples": samples(tmp_path / f"eval-{kind}.npy", 1 if kind == "stpo" else 2),
        "pretrained_samples": samples(tmp_path / "eval-pretrained.npy", 0),
        "seconds": {"pairs": 35.0, "eval_pretrained": 8.0, "train": 36.0, "eval_tuned": 9.0},
    }


def untrained(tmp_path: Path, kind: str) -> dict:
    """A result with no pair, as a smoke run's model gives: empty curves, tuned = pretrained."""
    path = samples(tmp_path / "eval-pretrained.npy", 0)
    m = measures(0.0, 0.0, 0.2)
    return {
        "objective": kind,
        "pairs": 0,
        "batch_size": 0,
        "note": NOTE,
        "curves": {
            k: [] for k in ("step", "loss", "winner_gap", "loser_gap", "margin", "accuracy")
        },
        "pretrained": m,
        "tuned": m,
        "hf_energy_ratio": 1.0,
        "samples": path,
        "pretrained_samples": path,
        "seconds": {"pairs": 50.0, "eval_pretrained": 10.0},
    }


@pytest.fixture
def results(tmp_path: Path) -> dict[str, dict]:
    stpo = trained(tmp_path, "stpo", winner_end=-0.0012, winner_max=0.0005)
    return {"stpo": stpo, "dpo": trained(tmp_path, "dpo", winner_end=0.085, winner_max=0.174)}


def image_rows(section: str) -> list[str]:
    table = section[section.index('<table class="images">') :]
    return re.findall(r"<tr><th>([^<]+)</th>", table)


def test_the_section_compares_pretrained_stpo_and_dpo(results):
    section = report.preference_section(results, PROMPTS)
    for cell in ("pretrained", "0.765", "STPO", "0.807", "1.542", "DPO", "0.673", "3.399"):
        assert f"<td>{cell}</td>" in section, cell
    gaps = preference.gap_stats(results["dpo"])
    assert gaps["winner_gap_end"] == pytest.approx(0.085)
    assert f"<td>{gaps['winner_gap_max']:+.5f}</td>" in section
    # One chart: winner and loser gap per objective, on a linear scale (gaps cross 0).
    chart = section[section.index("<svg") : section.index("</svg>")]
    assert chart.count("<polyline") == 4 and "(log)" not in chart
    for name in ("STPO winner gap", "STPO loser gap", "DPO winner gap", "DPO loser gap"):
        assert name in chart
    assert "stroke-dasharray" in chart  # the y = 0 line
    # The grid: a row per model, the first seed of the first 8 held-out prompts.
    assert image_rows(section) == ["pretrained", "STPO", "DPO"]
    assert section.count("<img ") == 3 * 8
    assert PROMPTS[7] in section and PROMPTS[8] not in section
    assert "warning" not in section


def test_a_stage_without_pairs_shows_its_note_instead_of_curves(tmp_path):
    results = {kind: untrained(tmp_path, kind) for kind in preference.OBJECTIVES}
    section = report.preference_section(results, PROMPTS)
    assert "<svg" not in section
    assert section.count(html.escape(NOTE)) == 2
    assert section.count("<td>no pair: not trained</td>") == 2
    assert image_rows(section) == ["pretrained"]
    summary = preference.summary(results)
    assert summary["stpo"]["gaps"] is None and summary["stpo"]["note"] == NOTE
    assert preference.summary_line("stpo", results["stpo"]).startswith("STPO not trained: no")


def test_summary_and_terminal_lines_carry_the_measures(results):
    summary = preference.summary(results)
    assert list(summary) == ["stpo", "dpo"]
    dpo = summary["dpo"]
    assert dpo["tuned"]["shapes_eval"] == 0.673 and dpo["hf_energy_ratio"] == 3.399
    assert dpo["gaps"]["winner_gap_max"] == max(results["dpo"]["curves"]["winner_gap"])
    assert dpo["pairs"] == 35 and "note" not in dpo
    line = preference.summary_line("dpo", results["dpo"])
    assert "ShapesEval 0.765 -> 0.673" in line and "x3.40" in line and "35 pairs" in line


def test_the_page_stays_self_contained(results, tmp_path):
    page = html.page(
        "demo", [("Preference optimization", report.preference_section(results, PROMPTS))]
    )
    assert not re.search(r'(src|href)="(https?:)?//', page)


@pytest.mark.parametrize("quick", [False, True])
def test_the_recipes_preference_tables_sample_as_eval_does(quick):
    cfg = load_demo_config(quick)
    p = cfg.preference
    assert (p.sample_steps, p.sample_cfg, p.eval_seeds) == (
        cfg.eval.steps,
        cfg.eval.cfg,
        cfg.eval.seeds,
    )
    # the full recipe: every training prompt x 8 samples, 4 rubric-decided pairs each
    assert (p.max_train_prompts, p.samples_per_prompt, p.pairs_per_prompt) == (
        (8, 2, 1) if quick else (256, 8, 4)
    )
    assert p.steps == (6 if quick else 150)
    assert load_demo_config(quick, overrides=["eval.steps=5"]).preference.sample_steps == 5


def test_the_sampling_fields_are_refused_in_preference_and_named_in_eval(tmp_path):
    recipe = tmp_path / "demo.toml"
    recipe.write_text(
        recipe_text(True).replace("[preference]\n", "[preference]\nsample_steps = 3\n")
    )
    with pytest.raises(
        ConfigError, match=re.escape("preference.sample_steps is the demo's eval.steps")
    ):
        load_demo_config(True, recipe)
    with pytest.raises(ConfigError, match=re.escape("set eval.cfg instead")):
        load_demo_config(True, overrides=["preference.sample_cfg=4"])
    with pytest.raises(ConfigError, match="batch_size=3 must be even"):
        load_demo_config(True, overrides=["preference.batch_size=3"])
