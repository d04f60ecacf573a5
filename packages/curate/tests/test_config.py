"""Curate settings: overrides and files change the thresholds they name and nothing else."""

from __future__ import annotations

import pytest

from krea2.curate.config import StageThresholds, load_curate_config
from krea2.infra.config import ConfigError
from krea2.infra.errors import UserError


def test_the_documented_stage_override_changes_one_threshold_of_one_stage():
    cfg = load_curate_config(None, ["stages.256.max_aspect=2.5"])
    default = load_curate_config()
    assert cfg.stages["256"].max_aspect == 2.5
    assert cfg.stages["256"].min_side == 256  # the stage's own default, not the class's
    assert cfg.stages["512"] == default.stages["512"]
    assert cfg.stages["1024"] == default.stages["1024"]


def test_a_config_file_merges_its_stages_onto_the_defaults(tmp_path):
    path = tmp_path / "curate.toml"
    path.write_text('stage = "512"\n[stages.512]\nmax_aspect = 4.0\n[decode]\nmax_seconds = 5\n')
    cfg = load_curate_config(path, ["stages.512.max_text_area=0.3"])
    default = load_curate_config()
    assert sorted(cfg.stages) == ["1024", "256", "512"]
    assert cfg.thresholds().min_side == 512 and cfg.thresholds().max_aspect == 4.0
    assert cfg.thresholds().max_text_area == 0.3
    assert cfg.stages["256"] == default.stages["256"]
    assert cfg.decode.max_seconds == 5.0


def test_a_new_stage_starts_from_the_class_defaults():
    cfg = load_curate_config(None, ["stages.2048.min_side=2048"], stage="2048")
    assert cfg.thresholds() == StageThresholds(min_side=2048)


def test_bad_stage_overrides_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'max_aspect'"):
        load_curate_config(None, ["stages.256.max_aspekt=2.5"])
    with pytest.raises(ConfigError, match=r"stages\.256\.max_aspect"):
        load_curate_config(None, ["stages.256.max_aspect=wide"])
    with pytest.raises(ConfigError, match=r"stages\.<name>\.<field>=value"):
        load_curate_config(None, ["stages.max_aspect=2.5"])
    with pytest.raises(UserError, match="stage '2048' has no thresholds"):
        load_curate_config(None, [], stage="2048")
