"""The turbo stage's yardsticks: its settings refuse what cannot be measured, saturation and
the spread of detections read what they say, and the checks apply the issue's bounds."""

from __future__ import annotations

import numpy as np
import pytest

from krea2.curate.shapes import render, sample_scene
from krea2.pipeline.config import TurboStageSettings
from krea2.pipeline.turbo_stage import checks, free_prompts, saturation, spread_of_detections
from krea2.rl.distill import TdmConfig


def test_settings_must_measure_the_students_own_step_count():
    with pytest.raises(ValueError, match=r"tdm\.student_steps=4"):
        TurboStageSettings(eval_steps=[1, 2, 8])
    with pytest.raises(ValueError, match="eval_steps"):
        TurboStageSettings(eval_steps=[0, 4])
    s = TurboStageSettings(eval_steps=[2], tdm=TdmConfig(student_steps=2))
    assert s.tdm.krea_guidance == s.tdm.teacher_guidance - 1


def test_saturation_reads_the_foreground_not_the_dark_backgrounds_noise():
    grey = np.full((1, 8, 8, 3), 128, np.uint8)
    red = np.zeros((1, 8, 8, 3), np.uint8)
    red[..., 0] = 200
    assert saturation(grey)[0] == 0.0 and saturation(red)[0] == pytest.approx(1.0)
    noisy = np.zeros((1, 8, 8, 3), np.uint8)
    noisy[..., 0] = 3  # faint red noise on black: fully saturated, but not foreground
    noisy[0, :2, :2] = 128  # a grey object
    assert saturation(noisy)[0] == 0.0


def test_free_prompts_name_only_colour_and_shape_once_each():
    concepts = [("blue", "square", 3), ("blue", "square", 8), ("red", "circle", 0)]
    assert free_prompts(concepts) == ["A blue square", "A red circle"]
    assert free_prompts(concepts, most=1) == ["A blue square"]


def test_one_picture_for_every_seed_has_no_spread_and_different_scenes_have_some():
    rng = np.random.default_rng(0)
    scenes = [render(sample_scene(rng, max_objects=1), 64, 64) for _ in range(4)]
    same = np.stack([np.stack([scenes[0]] * 4)])  # [P=1, S=4, H, W, 3]
    varied = np.stack([np.stack(scenes)])
    assert spread_of_detections(same) == {"position": 0.0, "size": 0.0, "background": 0.0}
    spread = spread_of_detections(varied)
    assert spread["position"] > 0.02 and spread["size"] > 0


def _result(student: float, teacher: float, teacher_k: float, plain: float, spread: float):
    def m(score: float, sat: float = 0.7, noise: float = 1.0) -> dict:
        return {"shapes_eval": score, "saturation": sat, "bg_noise": noise}

    def div(s: float) -> dict:
        return {"position": s, "size": s, "background": s}

    drift = spread < 0.08  # the bad case also drifts
    return {
        "measures": {"S": m(student, 0.9 if drift else 0.72, 3.0 if drift else 1.2),
                     "Tk": m(teacher_k), "T": m(teacher), "T0": m(plain)},
        "keys": {"student": "S", "teacher_k": "Tk", "teacher": "T", "teacher_no_cfg": "T0"},
        "deltas": {"S4 - T20 no CFG": {"delta": student - plain, "se": 0.01}},
        "speed": {"speedup_vs_cfg": 9.0, "nfe_ratio_vs_cfg": 10.0},
        "diversity": {"student": div(spread), "teacher": div(0.1)},
    }  # fmt: skip


def test_checks_apply_the_issues_bounds():
    good = checks(_result(student=0.78, teacher=0.80, teacher_k=0.50, plain=0.60, spread=0.09))
    assert all(c["holds"] for c in good.values()), good
    assert set(good) == {"quality", "beats_fewer_teacher_steps", "no_collapse", "no_drift",
                         "speed_vs_cfg", "guidance_distilled"}  # fmt: skip
    bad = checks(_result(student=0.62, teacher=0.80, teacher_k=0.50, plain=0.60, spread=0.05))
    assert not bad["quality"]["holds"] and not bad["guidance_distilled"]["holds"]
    assert not bad["beats_fewer_teacher_steps"]["holds"] and not bad["no_collapse"]["holds"]
    assert not bad["no_drift"]["holds"]
    # no guidance gain to distil (CFG does not help the teacher): that check does not apply
    assert "guidance_distilled" not in checks(_result(0.8, 0.8, 0.5, 0.85, 0.1))
