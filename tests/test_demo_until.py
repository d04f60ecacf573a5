"""``krea2 demo --until STAGE``: stop once a stage is done; a later run continues."""

from __future__ import annotations

import pytest

from krea2.infra import UserError
from krea2.pipeline.config import load_demo_config
from krea2.pipeline.demo import run_demo, stage_names
from krea2.pipeline.stages import StageRunner, StoppedAfter


def test_the_runner_stops_after_the_named_stage_and_a_rerun_continues(tmp_path):
    ran: list[str] = []

    def stages(runner: StageRunner) -> None:
        for name in ("a", "b", "c"):
            runner.run(name, name, lambda name=name: ran.append(name) or {"n": len(ran)})

    with pytest.raises(StoppedAfter) as stop:
        stages(StageRunner(tmp_path, until="b"))
    assert stop.value.stage == "b" and ran == ["a", "b"]
    assert not (tmp_path / "stages" / "c.json").exists()
    with pytest.raises(StoppedAfter):  # stopping after a stage done earlier runs nothing
        stages(StageRunner(tmp_path, until="a"))
    assert ran == ["a", "b"]
    stages(StageRunner(tmp_path))
    assert ran == ["a", "b", "c"]


def test_stage_names_follow_the_recipe():
    names = stage_names(load_demo_config(True))
    assert names[:3] == ["shards", "pool", "curate"]
    assert [n for n in names if n.startswith("export-")] == ["export-32", "export-64"]
    assert names[-9:] == ["sft-merge", "preference-stpo", "preference-dpo", "rl", "chain",
                          "turbo", "style", "expander", "report"]  # fmt: skip


def test_an_unknown_stage_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"--until 'pretrian' is not a stage .*pretrain"):
        run_demo(out, True, until="pretrian")
    assert not out.exists()
