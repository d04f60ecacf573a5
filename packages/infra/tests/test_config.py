"""Config loading: TOML + overrides into typed dataclasses, clear errors, round trips."""

from __future__ import annotations

import enum
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from krea2.infra.config import (
    ConfigError,
    config_to_toml,
    load_config,
    parse_override,
    save_config,
)


class Kind(enum.Enum):
    ADAMW = "adamw"
    MUON = "muon"


@dataclass
class Optimizer:
    name: Kind = Kind.ADAMW
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)


@dataclass
class Stage:
    name: str = "256"
    steps: int = 100
    data: Path | None = None


@dataclass
class Job:
    seed: int = 0
    compile: bool = False
    optimizer: Optimizer = field(default_factory=Optimizer)
    stages: list[Stage] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_loads_nested_sections_enums_paths_and_lists(tmp_path):
    path = write(
        tmp_path,
        """
seed = 3
[optimizer]
name = "muon"
lr = 2e-4
[[stages]]
name = "512"
data = "shards/512"
""",
    )
    job = load_config(Job, path)
    assert job.optimizer.name is Kind.MUON
    assert job.optimizer.lr == 2e-4
    assert job.stages == [Stage(name="512", steps=100, data=Path("shards/512"))]
    assert job.seed == 3


def test_overrides_win_over_the_file_and_parse_toml_values(tmp_path):
    path = write(tmp_path, "[optimizer]\nlr = 0.1\n")
    job = load_config(Job, path, ["optimizer.lr=3e-4", "compile=true", "optimizer.name=MUON"])
    assert job.optimizer.lr == 3e-4
    assert job.compile is True
    assert job.optimizer.name is Kind.MUON


def test_unknown_key_names_key_file_and_closest_valid_key(tmp_path):
    path = write(tmp_path, "[optimizer]\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(Job, path)
    message = str(err.value)
    assert "optimizer.learning_rate" in message
    assert str(path) in message
    assert "did you mean 'lr'" in message


def test_unknown_override_key_suggests_the_closest_key():
    with pytest.raises(ConfigError, match=r"optimizer\.lrr.*did you mean 'lr'"):
        load_config(Job, overrides=["optimizer.lrr=1"])


def test_wrong_type_names_the_key_and_the_expected_type(tmp_path):
    path = write(tmp_path, 'seed = "three"\n')
    with pytest.raises(ConfigError, match=r"'seed'.*expected an integer.*'three'"):
        load_config(Job, path)


def test_bad_enum_value_lists_the_choices():
    with pytest.raises(ConfigError, match=r"one of 'adamw', 'muon'"):
        load_config(Job, overrides=["optimizer.name=sgd"])


def test_malformed_override_and_missing_file_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("optimizer.lr")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Job, tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(Job, write(tmp_path, "seed = = 1"))


def test_post_init_validation_becomes_a_config_error():
    @dataclass
    class Positive:
        n: int = 1

        def __post_init__(self) -> None:
            if self.n <= 0:
                raise ValueError(f"n must be positive, got {self.n}")

    with pytest.raises(ConfigError, match="n must be positive, got -2"):
        load_config(Positive, overrides=["n=-2"])


def test_saved_config_is_toml_that_loads_back_equal(tmp_path):
    job = Job(seed=7, stages=[Stage("1024", 5, Path("d"))], tags={"a": "b"})
    path = save_config(job, tmp_path / "run" / "config.toml")
    assert load_config(Job, path) == job


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-./ ", max_size=12)
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
stages = st.builds(
    Stage,
    name=names,
    steps=st.integers(min_value=-(2**62), max_value=2**62),
    data=st.one_of(st.none(), st.builds(Path, st.text("abc/", min_size=1, max_size=8))),
)
jobs = st.builds(
    Job,
    seed=st.integers(min_value=0, max_value=2**31),
    compile=st.booleans(),
    optimizer=st.builds(
        Optimizer, name=st.sampled_from(Kind), lr=floats, betas=st.tuples(floats, floats)
    ),
    stages=st.lists(stages, max_size=3),
    tags=st.dictionaries(st.text("xyz", min_size=1, max_size=3), names, max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(jobs)
def test_any_config_round_trips_through_toml(job):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.toml"
        path.write_text(config_to_toml(job))
        assert load_config(Job, path) == job


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(min_value=0), st.booleans())
def test_override_values_parse_as_toml_scalars(x, n, b):
    job = load_config(
        Job, overrides=[f"optimizer.lr={x!r}", f"seed={n}", f"compile={str(b).lower()}"]
    )
    assert job.optimizer.lr == x
    assert job.seed == n
    assert job.compile is b


def test_numeric_override_keys_index_lists_of_tables(tmp_path):
    path = write(tmp_path, '[[stages]]\nname = "256"\n[[stages]]\nname = "512"\n')
    job = load_config(Job, path, ["stages.1.steps=500"])
    assert [s.steps for s in job.stages] == [100, 500]
    with pytest.raises(ConfigError, match=r"stages\.2.*index below 2"):
        load_config(Job, path, ["stages.2.steps=1"])
    with pytest.raises(ConfigError, match=r"stages\.1\.stepz.*did you mean 'steps'"):
        load_config(Job, path, ["stages.1.stepz=1"])


@dataclass
class Thresholds:
    min_side: int = 256
    max_aspect: float = 3.0


def _default_stages() -> dict[str, Thresholds]:
    return {"256": Thresholds(), "1024": Thresholds(min_side=1024, max_aspect=2.0)}


@dataclass
class NamedSections:
    stage: str = "256"
    stages: dict[str, Thresholds] = field(default_factory=_default_stages)
    weights: dict[str, float] = field(default_factory=lambda: {"a": 1.0, "b": 2.0})


def test_named_sections_are_set_by_name_and_merge_onto_their_defaults(tmp_path):
    cfg = load_config(NamedSections, None, ["stages.256.max_aspect=2.5"])
    assert cfg.stages == {"256": Thresholds(256, 2.5), "1024": Thresholds(1024, 2.0)}
    path = tmp_path / "c.toml"
    path.write_text("[stages.1024]\nmax_aspect = 1.5\n[stages.2048]\nmin_side = 2048\n")
    cfg = load_config(NamedSections, path, ["stages.2048.max_aspect=1.2"])
    assert cfg.stages == {
        "256": Thresholds(256, 3.0),
        "1024": Thresholds(1024, 1.5),
        "2048": Thresholds(2048, 1.2),
    }
    with pytest.raises(ConfigError, match=r"stages\.256\.max_aspct.*did you mean 'max_aspect'"):
        load_config(NamedSections, None, ["stages.256.max_aspct=2.5"])
    with pytest.raises(ConfigError, match=r"holds named Thresholds sections.*stages\.<name>"):
        load_config(NamedSections, None, ["stages.max_aspect=2.5"])


def test_a_plain_dict_is_replaced_not_merged(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[weights]\nc = 3.0\n")
    assert load_config(NamedSections, path).weights == {"c": 3.0}
    assert load_config(NamedSections, None, ["weights.a=0.5"]).weights == {"a": 0.5, "b": 2.0}
