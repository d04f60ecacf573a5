"""Everything ``krea2 train`` checks before any work, ``--dry-run`` included: the config
(:mod:`krea2.trainer.validate`), the files it names (the autoencoder's and text encoder's
configs, the released weights' shape) and each stage's shards, read as the trainer's
index reads them (bucket column and footer metadata; no image is decoded). Every problem
the real run would meet at its start is one ``error:`` line naming the setting and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from krea2.infra.errors import UserError
from krea2.trainer.config import JobConfig, StageConfig
from krea2.trainer.data import ShardIndex
from krea2.trainer.validate import job_problems, raise_problems, resolve_files

# A stage's shards are at its resolution when each bucket's side (sqrt of its area) is
# within this factor of it; curate's aspect buckets stay within 10% of the side.
SIDE_TOLERANCE = 1.25


def preflight(cfg: JobConfig, world_size: int = 1) -> list[str]:
    """Raise one UserError listing every problem of ``cfg`` for ``world_size`` ranks: the
    config's and its files' (:func:`krea2.trainer.validate.job_problems`), then each
    stage's data and held-out data against its batch size, resolution and patch. Returns
    the warnings (one line each) when there is no problem."""
    found = Findings(errors=job_problems(cfg, world_size))
    try:
        factor = _latent_factor(cfg)
    except UserError:
        factor = None  # reported above; the data checks need it
    for i, stage in enumerate(cfg.stages if factor is not None else []):
        stage_data_findings(cfg, i, stage, factor, found)
    raise_problems(found.errors)
    return found.warnings


@dataclass
class Findings:
    """What the checks found: problems that stop the job, and warnings."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _latent_factor(cfg: JobConfig) -> int:
    from krea2.dit.components import latent_space
    from krea2.trainer.validate import autoencoder_spec

    return latent_space(autoencoder_spec(cfg.model)).factor


def stage_data_findings(
    cfg: JobConfig, index: int, stage: StageConfig, ae_factor: int, found: Findings
) -> None:
    """Add the problems of stage ``index``'s data and eval data to ``found``: too few
    consecutive rows of one bucket for its batch, buckets the DiT cannot patchify, images
    far from its resolution. A held-out set without a full batch is a warning: the trainer
    refuses it today when the stage starts, though a smaller held-out set is no mistake."""
    from krea2.trainer.model_shape import dit_config

    try:
        factor = ae_factor * dit_config(cfg, stage).patch
    except UserError:
        return  # the model config's own problem is reported already
    problems = found.errors
    for kind in ("data", "eval_data"):
        patterns = getattr(stage, kind)
        if not patterns:
            continue
        where = f"stage {stage.name!r} {kind}"
        setting = f"stages.{index}.batch_size"
        try:
            files = resolve_files(patterns, where)
        except UserError as e:
            problems.append(str(e))
            continue
        try:
            shards = ShardIndex(files, stage.batch_size, 0, where=where, setting=setting)
        except UserError as e:
            if kind == "eval_data":
                found.warnings.append(f"{e} (the run stops when this stage starts)")
            else:
                problems.append(str(e))
            try:  # every row's bucket, for the checks below
                shards = ShardIndex(files, 1, 0)
            except UserError:
                continue
        sizes = sorted({ref.size for ref in shards.batches})
        problems += [
            f"{where}: bucket {w}x{h} is not divisible by autoencoder factor x patch = {factor}; "
            f"prepare the shards with buckets that are multiples of {factor}"
            for w, h in sizes
            if w % factor or h % factor
        ]
        problem = _resolution_problem(stage, index, where, sizes, factor)
        if problem is not None:
            problems.append(problem)


def _resolution_problem(
    stage: StageConfig, index: int, where: str, sizes: list[tuple[int, int]], factor: int
) -> str | None:
    """Why the shards' images do not match ``stage.resolution`` (None when they do)."""
    far = [
        (w, h)
        for w, h in sizes
        if abs(math.log(math.sqrt(w * h) / stage.resolution)) > math.log(SIDE_TOLERANCE)
    ]
    if not far:
        return None
    side = math.sqrt(sum(w * h for w, h in sizes) / len(sizes))
    side = max(factor, round(side / factor) * factor)
    w, h = far[0]
    tokens = (w // factor) * (h // factor)
    return (
        f"{where}: stages.{index}.resolution={stage.resolution}, but the shards hold "
        f"{w}x{h} images (about {side} px, {tokens:,} image tokens each); set "
        f"stages.{index}.resolution = {side}, or prepare the shards with --side "
        f"{stage.resolution}"
    )
