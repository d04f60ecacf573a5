"""The demo's recipe ships in the package and embeds the trainer's own job config."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w

from krea2.infra import ConfigError, config_to_dict
from krea2.pipeline.config import load_demo_config, recipe_text, smoke_note, training_job
from krea2.trainer import load_job


@pytest.mark.parametrize("quick", [False, True])
def test_the_train_table_is_a_trainer_job_file(tmp_path: Path, quick: bool) -> None:
    table = tomllib.loads(recipe_text(quick))["train"]
    job_file = tmp_path / "job.toml"
    job_file.write_text(tomli_w.dumps(table))
    demo = load_demo_config(quick)
    assert config_to_dict(load_job(job_file)) == config_to_dict(demo.train)
    assert [s.resolution for s in demo.train.stages] == [32, 64]


def test_the_demo_fills_in_only_what_its_run_decides() -> None:
    cfg = load_demo_config(quick=True)
    job = training_job(cfg, Path("/run"), [Path("/a"), Path("/b")], ["a red circle"])
    assert job.run_dir == Path("/run")
    assert [s.data for s in job.stages] == [["/a/shard-*.parquet"], ["/b/shard-*.parquet"]]
    assert job.observe.sample_prompts == ["a red circle"]
    unchanged = config_to_dict(job) | {"run_dir": None, "stages": None, "observe": None}
    assert unchanged == config_to_dict(cfg.train) | {
        "run_dir": None,
        "stages": None,
        "observe": None,
    }


def test_overrides_reach_the_trainer_stages_and_typos_are_named() -> None:
    cfg = load_demo_config(False, overrides=["train.stages.1.steps=7", "eval.cfg=2.5"])
    assert cfg.train.stages[1].steps == 7 and cfg.eval.cfg == 2.5
    with pytest.raises(ConfigError, match="did you mean"):
        load_demo_config(False, overrides=["train.optimizr.lr=1e-3"])
    with pytest.raises(ConfigError, match="index below 2"):
        load_demo_config(False, overrides=["train.stages.5.steps=1"])
    assert load_demo_config(False, overrides=["pool.styled=0.3"]).pool.styled == 0.3
    with pytest.raises(ConfigError, match="styled"):  # at load, before any stage
        load_demo_config(False, overrides=["pool.styled=1.5"])


def test_only_the_quick_recipe_is_a_smoke_run_and_its_note_says_what_the_full_one_reaches():
    assert smoke_note(load_demo_config(quick=False)) is None
    note = smoke_note(load_demo_config(quick=True))
    assert note is not None and note.startswith("Smoke run: 36 training steps")
    assert "krea2 demo" in note and "ShapesEval" in note


def test_rl_prompts_word_a_share_of_the_concepts_without_the_background() -> None:
    from krea2.curate.shapes import eval_prompt
    from krea2.pipeline.config import RlPromptSpec
    from krea2.pipeline.rl_stage import training_prompts

    train = [
        (c, s, cell) for c in ("red", "blue") for s in ("circle", "square") for cell in range(9)
    ]
    assert training_prompts(train, RlPromptSpec()) == [eval_prompt(c) for c in train]
    mixed = training_prompts(train, RlPromptSpec(content_share=0.5, seed=3))
    assert mixed == training_prompts(train, RlPromptSpec(content_share=0.5, seed=3))
    content = [p for p, c in zip(mixed, train, strict=True) if p != eval_prompt(c)]
    assert 9 <= len(content) <= 27  # about half of 36
    assert all("background" not in p and p.endswith(".") for p in content)
    assert all("background" not in p for p in training_prompts(train, RlPromptSpec(1.0)))
    cfg = load_demo_config(False, overrides=["rl_prompts.content_share=0.25"])
    assert cfg.rl_prompts.content_share == 0.25
    with pytest.raises(ConfigError, match="content_share"):
        load_demo_config(False, overrides=["rl_prompts.content_share=2"])
