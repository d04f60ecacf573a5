"""The turbo stage's yardsticks: its settings refuse what cannot be measured, saturation and
the spread of detections read what they say, and the checks apply the issue's bounds."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate.shapes import render, sample_scene
from krea2.pipeline.config import TurboStageSettings
from krea2.pipeline.turbo_stage import checks, saturation, spread_of_detections
from krea2.rl.distill import TdmConfig


def test_settings_must_measure_the_students_own_step_count():
    with pytest.raises(ValueError, match=r"tdm\.student_steps=4"):
        TurboStageSettings(eval_steps=[1, 2, 8])
    with pytest.raises(ValueError, match="eval_steps"):
        TurboStageSettings(eval_steps=[0, 4])
    s = TurboStageSettings(eval_steps=[2], tdm=TdmConfig(student_steps=2))
    assert s.tdm.krea_guidance == s.tdm.teacher_guidance - 1


def test_saturation_is_zero_for_grey_and_one_for_pure_colour():
    grey = np.full((1, 8, 8, 3), 128, np.uint8)
    red = np.zeros((1, 8, 8, 3), np.uint8)
    red[..., 0] = 200
    assert saturation(grey)[0] == 0.0 and saturation(red)[0] == pytest.approx(1.0)


def test_one_picture_for_every_seed_has_no_spread_and_different_scenes_have_some():
    rng = np.random.default_rng(0)
    scenes = [render(sample_scene(rng, max_objects=1), 64, 64) for _ in range(4)]
    same = np.stack([np.stack([scenes[0]] * 4)])  # [P=1, S=4, H, W, 3]
    varied = np.stack([np.stack(scenes)])
    assert spread_of_detections(same) == {"position": 0.0, "size": 0.0, "background": 0.0}
    spread = spread_of_detections(varied)
    assert spread["position"] > 0.02 and spread["size"] > 0


def _result(student: float, teacher: float, teacher_k: float, plain: float, spread: float):
    def m(score: float, s: float = 0.1) -> dict:
        return {"shapes_eval": score, "spread": {"position": s, "size": s, "background": s}}

    return {
        "measures": {"S": m(student, spread), "Tk": m(teacher_k), "T": m(teacher),
                     "T0": m(plain)},
        "keys": {"student": "S", "teacher_k": "Tk", "teacher": "T", "teacher_no_cfg": "T0"},
        "deltas": {"S4 - T20 no CFG": {"delta": student - plain, "se": 0.01}},
        "speed": {"speedup_vs_cfg": 9.0, "nfe_ratio_vs_cfg": 10.0},
    }  # fmt: skip


def test_checks_apply_the_issues_bounds():
    good = checks(_result(student=0.78, teacher=0.80, teacher_k=0.50, plain=0.60, spread=0.09))
    assert all(c["holds"] for c in good.values()), good
    assert set(good) == {"quality", "beats_fewer_teacher_steps", "no_collapse",
                         "speed_vs_cfg", "guidance_distilled"}  # fmt: skip
    bad = checks(_result(student=0.62, teacher=0.80, teacher_k=0.50, plain=0.60, spread=0.05))
    assert not bad["quality"]["holds"] and not bad["guidance_distilled"]["holds"]
    assert not bad["beats_fewer_teacher_steps"]["holds"] and not bad["no_collapse"]["holds"]
    # no guidance gain to distil (CFG does not help the teacher): that check does not apply
    assert "guidance_distilled" not in checks(_result(0.8, 0.8, 0.5, 0.85, 0.1))
