"""The chain measures each model on the samples the stages before it drew the same way
(``krea2.pipeline.chain.drawn_alike``), and samples only what no stage drew alike."""

from __future__ import annotations

from pathlib import Path

from krea2.pipeline import chain, preference, rl_stage
from krea2.pipeline.config import EvalSpec


def stage_results(tmp: Path, pref_steps: int = 20, rl_seeds: list[int] | None = None,
                  rl_cfg: float = 3.0, tuned_cfg: bool = True) -> dict:  # fmt: skip
    """What the preference and RL stages record about their held-out samples."""
    seeds = [0, 1, 2]
    pref = {
        "settings": {"sample_steps": pref_steps, "sample_cfg": 3.0, "eval_seeds": seeds},
        "pretrained_samples": str(tmp / "pref-start.npy"),
        "samples": str(tmp / "pref.npy"),
    }

    def measured(tag: str, with_cfg: bool) -> dict:
        keys = ("no_cfg", "cfg") if with_cfg else ("no_cfg",)
        return {k: {"shapes_eval": 0.5, "samples": str(tmp / f"rl-{tag}-{k}.npy")} for k in keys}

    rl = {"settings": {"eval_steps": 20, "eval_seeds": rl_seeds or seeds, "eval_cfg": rl_cfg},
          "pretrained": measured("start", True), "tuned": measured("tuned", tuned_cfg)}  # fmt: skip
    return {preference.stage_name("stpo"): pref, rl_stage.STAGE: rl}


EV = EvalSpec(seeds=[0, 1, 2], steps=20, cfg=3.0)


def test_every_sample_set_drawn_alike_is_reused(tmp_path: Path) -> None:
    got = chain.drawn_alike(stage_results(tmp_path), EV, tmp_path / "sample.npy")
    assert got == {
        "pretrained-cfg": tmp_path / "sample.npy",
        "sft-cfg": tmp_path / "pref-start.npy",
        "po-cfg": tmp_path / "rl-start-cfg.npy",  # the RL stage measured its start on pref.npy
        "po-no_cfg": tmp_path / "rl-start-no_cfg.npy",
        "raw-cfg": tmp_path / "rl-tuned-cfg.npy",
        "raw-no_cfg": tmp_path / "rl-tuned-no_cfg.npy",
    }
    # pretrained without CFG is the only set left to sample


def test_a_stage_that_sampled_otherwise_is_sampled_again(tmp_path: Path) -> None:
    other_steps = chain.drawn_alike(stage_results(tmp_path, pref_steps=8), EV, tmp_path / "s.npy")
    assert "sft-cfg" not in other_steps and "po-no_cfg" in other_steps
    other_seeds = chain.drawn_alike(stage_results(tmp_path, rl_seeds=[0]), EV, tmp_path / "s.npy")
    assert {k for k in other_seeds if k.startswith(("raw", "po-no"))} == set()
    assert other_seeds["po-cfg"] == tmp_path / "pref.npy"
    other_cfg = chain.drawn_alike(stage_results(tmp_path, rl_cfg=2.0), EV, tmp_path / "s.npy")
    assert "raw-cfg" not in other_cfg and "raw-no_cfg" in other_cfg
    no_cfg_only = chain.drawn_alike(stage_results(tmp_path, tuned_cfg=False), EV, tmp_path / "s")
    assert "raw-cfg" not in no_cfg_only and "po-cfg" in no_cfg_only


def test_before_the_rl_stage_only_the_preference_samples_are_known(tmp_path: Path) -> None:
    results = stage_results(tmp_path)
    del results[rl_stage.STAGE]
    got = chain.drawn_alike(results, EV, tmp_path / "s.npy")
    assert got["po-cfg"] == tmp_path / "pref.npy" and "raw-no_cfg" not in got
