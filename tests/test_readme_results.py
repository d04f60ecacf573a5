"""scripts/readme_results.py: the README's results table is generated from a summary."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "_readme_results", ROOT / "scripts" / "readme_results.py"
)
readme_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_results)


def _model(score: float, delta: float | None = None) -> dict:
    m = {"shapes_eval": score, "all_correct": score / 2}
    if delta is not None:
        m["delta"] = {"delta": delta, "se": 0.01}
    return m


SUMMARY = {
    "chain": {
        "pretrained": {"cfg": _model(0.7), "no_cfg": _model(0.5)},
        "raw": {"cfg": _model(0.72, 0.02), "no_cfg": _model(0.8, 0.3)},
        "settings": {"prompts": 28, "seeds": [0, 1, 2], "steps": 20, "cfg": 3.0},
    }
}


def test_the_table_has_a_row_per_chain_stage_with_paired_differences():
    table = readme_results.results_table(SUMMARY, "2026-12-05", "2-core VM")
    lines = table.splitlines()
    assert "2026-12-05, 2-core VM" in lines[0] and "28 held-out prompts × 3 seeds" in lines[0]
    assert lines[2].startswith("| chain stage | ShapesEval, CFG 3 |")
    assert lines[4] == "| pretrained | 0.700 |  | 0.350 | 0.500 |  | 0.250 |"
    assert lines[5] == "| raw | 0.720 | +0.020 ± 0.010 | 0.360 | 0.800 | +0.300 ± 0.010 | 0.400 |"


def test_only_the_marked_section_changes_and_rewriting_is_stable():
    text = "intro\n<!-- results:begin -->\nold\n<!-- results:end -->\noutro\n"
    once = readme_results.replace_section(text, "new table")
    assert once == "intro\n<!-- results:begin -->\nnew table\n<!-- results:end -->\noutro\n"
    assert readme_results.replace_section(once, "new table") == once
    with pytest.raises(ValueError, match="exactly one"):
        readme_results.replace_section("no markers", "x")


def test_the_readme_holds_one_generated_section():
    text = (ROOT / "README.md").read_text()
    assert text.count(readme_results.BEGIN) == 1 and text.count(readme_results.END) == 1


def test_a_summary_with_turbo_adds_its_table_against_raw():
    def m(who: str, steps: int, cfg: float, score: float) -> dict:
        return {"who": who, "steps": steps, "cfg": cfg, "shapes_eval": score,
                "all_correct": score / 2}  # fmt: skip

    d = {"delta": 0.01, "se": 0.02}
    turbo = {
        "measures": {"student-4": m("student", 4, 0.0, 0.8),
                     "teacher-4-cfg3": m("teacher", 4, 3.0, 0.6),
                     "teacher-20-cfg3": m("teacher", 20, 3.0, 0.79),
                     "teacher-20": m("teacher", 20, 0.0, 0.7)},
        "keys": {"student": "student-4", "teacher_k": "teacher-4-cfg3",
                 "teacher": "teacher-20-cfg3", "teacher_no_cfg": "teacher-20"},
        "deltas": {"S4 - T20": d, "S4 - T4": d, "S4 - T20 no CFG": d},
        "speed": {"speedup_vs_cfg": 9.5},
    }  # fmt: skip
    lines = readme_results.results_table(SUMMARY | {"turbo": turbo}, "d", "m").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Turbo, distilled"))
    assert "9.5x faster" in lines[start]
    assert lines[start + 4] == "| Turbo (TDM), 4 steps, no CFG | 0.800 | 0.400 |  |"
    assert lines[start + 5] == "| raw, 20 steps, CFG 3 | 0.790 | 0.395 | +0.010 ± 0.020 |"
    assert lines[start + 7] == "| raw, 20 steps, no CFG | 0.700 | 0.350 | +0.010 ± 0.020 |"
