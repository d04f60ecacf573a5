"""Which stages of a run are finished, and extending a finished stage to more steps.

A stage is finished when its ``checkpoints/<stage>.done`` marker exists; the marker holds
the steps it finished at. A config that asks a finished stage for more steps is refused
with the fix unless ``extend`` is given: then the marker goes and ``--resume`` continues
the stage from its last checkpoint to the new count (its learning-rate schedule is that
of the new length from then on).
"""

from __future__ import annotations

from pathlib import Path

from krea2.infra.errors import UserError
from krea2.infra.logging import get_logger
from krea2.trainer.config import StageConfig

__all__ = ["finished_steps", "stages_to_run"]

log = get_logger("trainer")


def finished_steps(run_dir: str | Path, stage: StageConfig) -> int | None:
    """The steps ``stage`` finished at in ``run_dir`` (None: not finished)."""
    marker = Path(run_dir) / "checkpoints" / f"{stage.name}.done"
    if not marker.exists():
        return None
    text = marker.read_text().strip()
    return int(text) if text.isdigit() else stage.steps


def stages_to_run(
    run_dir: str | Path, stages: list[StageConfig], extend: bool = False
) -> list[tuple[int, StageConfig]]:
    """(index, stage) of every stage still to train. A finished stage whose config now asks
    for more steps is reopened with ``extend`` (its marker removed, so a resume continues
    it), else a UserError says how to extend it."""
    todo = []
    for i, stage in enumerate(stages):
        done = finished_steps(run_dir, stage)
        if done is not None and done < stage.steps:
            if not extend:
                raise UserError(
                    f"stage {stage.name!r} finished at {done} steps and the config asks for "
                    f"{stage.steps}: pass --resume --extend to continue it from its last "
                    "checkpoint (its schedule then follows the new length), or set "
                    f"stages.{i}.steps={done}"
                )
            (Path(run_dir) / "checkpoints" / f"{stage.name}.done").unlink()
            log.info("stage %s: extending from %d to %d steps", stage.name, done, stage.steps)
            done = None
        if done is None:
            todo.append((i, stage))
        else:
            log.info("stage %s already finished; skipping", stage.name)
    return todo
