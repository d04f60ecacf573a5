"""PMA (average of the last N checkpoints, every K steps), weighted and TIES merging, from disk.

Nothing is kept in training memory: the averages stream over saved checkpoints, a group
of tensors at a time (at most ``chunk_bytes`` per source in memory), into fp32 sums.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from krea2.infra.checkpoint import CheckpointManager
from krea2.infra.errors import UserError
from krea2.trainer.checkpoint_tensors import DIT_PREFIX, load_tensors, tensor_keys


def average(
    sources: list[Path], weights: list[float] | None = None, chunk_bytes: int = 1 << 30
) -> dict[str, torch.Tensor]:
    """Weighted average of the DiT weights in ``sources`` (DCP step dirs or safetensors
    in released keys), keyed by the DiT's state-dict names. Uniform when ``weights`` is
    None; weights are normalised to sum to 1."""
    if not sources:
        raise UserError("nothing to average: give at least one checkpoint")
    weights = weights or [1.0] * len(sources)
    if len(weights) != len(sources) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise UserError(f"weights {weights} must be {len(sources)} non-negative numbers, not all 0")
    total = sum(weights)
    weights = [w / total for w in weights]
    meta, chunks = _key_chunks(sources[0], chunk_bytes)
    out: dict[str, torch.Tensor] = {}
    for chunk in chunks:
        acc: dict[str, torch.Tensor] = {}
        for src, w in zip(sources, weights, strict=True):
            part = load_tensors(src, chunk, meta)
            for k, v in part.items():
                acc[k] = acc[k].add_(v, alpha=w) if k in acc else v.mul_(w)
        out.update({k.removeprefix(DIT_PREFIX): v for k, v in acc.items()})
    return out


def _key_chunks(first: Path, chunk_bytes: int) -> tuple[dict, list[list[str]]]:
    """The DiT keys of ``first`` (a DCP step dir or safetensors) with their metadata, in
    groups of at most ``chunk_bytes`` of fp32 per source."""
    if first.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(first), "pt") as f:
            meta = {DIT_PREFIX + k: None for k in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    else:
        meta = tensor_keys(first, DIT_PREFIX)
    if not meta:
        raise UserError(f"{first} holds no DiT weights (keys under {DIT_PREFIX!r})")
    chunks, cur, size = [], [], 0
    for k in sorted(meta):
        nbytes = 4 * (int(torch.Size(meta[k].size).numel()) if meta[k] is not None else 0)
        if cur and size + nbytes > chunk_bytes:
            chunks.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += nbytes
    chunks.append(cur)
    return meta, chunks


def _task_vectors(
    base: Path, sources: list[Path], chunk_bytes: int
) -> Iterator[tuple[str, torch.Tensor, list[torch.Tensor]]]:
    """(DiT state-dict key, base tensor, each source's task vector source - base), a chunk
    of keys loaded at a time (as :func:`average` streams)."""
    meta, chunks = _key_chunks(sources[0], chunk_bytes)
    base_meta = meta if base.suffix == ".safetensors" else tensor_keys(base, DIT_PREFIX)
    for chunk in chunks:
        b = load_tensors(base, chunk, base_meta)
        parts = [load_tensors(src, chunk, meta) for src in sources]
        for k in chunk:
            yield k.removeprefix(DIT_PREFIX), b[k], [p[k] - b[k] for p in parts]


def ties_merge(
    base: Path,
    sources: list[Path],
    weights: list[float] | None = None,
    density: float = 0.2,
    scale: float = 1.0,
    chunk_bytes: int = 1 << 30,
) -> dict[str, torch.Tensor]:
    """TIES merging (Yadav et al. 2023) of fine-tuned ``sources`` made from ``base``: each
    task vector (source - base) keeps its top ``density`` share of entries by magnitude
    (per tensor), each entry's sign is elected by the weighted sum of the trimmed vectors,
    and the entries that agree with it are averaged (weighted by ``weights``, uniform when
    None); the result is ``base + scale * merged``. Streams like :func:`average`."""
    if len(sources) < 2:
        raise UserError("TIES merges at least two fine-tuned checkpoints")
    if not 0.0 < density <= 1.0:
        raise UserError(f"density={density} must be in (0, 1]")
    weights = weights or [1.0] * len(sources)
    if len(weights) != len(sources) or any(w <= 0 for w in weights):
        raise UserError(f"weights {weights} must be {len(sources)} positive numbers")
    out: dict[str, torch.Tensor] = {}
    for k, b, taus in _task_vectors(base, sources, chunk_bytes):
        flat = torch.stack(taus).reshape(len(sources), -1)  # [S, numel]
        keep = max(1, round(density * flat.shape[1]))
        cut = flat.abs().kthvalue(flat.shape[1] - keep + 1, dim=1, keepdim=True).values
        flat = torch.where(flat.abs() >= cut, flat, torch.zeros_like(flat))
        w = torch.tensor(weights).view(-1, 1)
        sign = torch.sign((w * flat).sum(0, keepdim=True))
        agree = (torch.sign(flat) == sign) & (flat != 0)
        total = (w * agree).sum(0).clamp_min(1e-12)
        merged = (w * flat * agree).sum(0) / total
        out[k] = b + scale * merged.view_as(b)
    return out


def task_arithmetic(
    base: Path,
    sources: list[Path],
    weights: list[float] | None = None,
    scale: float = 1.0,
    chunk_bytes: int = 1 << 30,
) -> dict[str, torch.Tensor]:
    """Task arithmetic (Ilharco et al. 2023): ``base + scale * sum_i w_i (source_i - base)``,
    each task vector in full (``weights`` default 1 each, not normalised): what stacking
    LoRA adapters at their strengths gives. Averaging scales a change made by one source
    alone (to content the others leave as the base has it) down to that source's weight;
    this keeps it whole. Streams like :func:`average`."""
    if not sources:
        raise UserError("task arithmetic needs at least one fine-tuned checkpoint")
    weights = weights or [1.0] * len(sources)
    if len(weights) != len(sources):
        raise UserError(f"weights {weights} must be {len(sources)} numbers")
    out: dict[str, torch.Tensor] = {}
    for k, b, taus in _task_vectors(base, sources, chunk_bytes):
        out[k] = b + scale * sum(w * t for t, w in zip(taus, weights, strict=True))
    return out


def pma_steps(root: Path, last: int, every: int) -> list[int]:
    """The newest ``last`` complete checkpoint steps under ``root`` whose step + 1 is a
    multiple of ``every`` (0: any)."""
    steps = CheckpointManager(root).complete_steps()
    if every:
        steps = [s for s in steps if (s + 1) % every == 0]
    if len(steps) < last:
        raise UserError(
            f"PMA wants {last} checkpoints every {every} steps under {root} but found {steps}; "
            "keep more (checkpoint.keep_every) or lower --last"
        )
    return steps[-last:]


def save_dit(
    state: dict[str, torch.Tensor], job_config: Path, out: Path, stage: str | None = None
) -> Path:
    """Write averaged weights as a released-format safetensors of the job's DiT (with the
    patch of the job's stage named ``stage``, when given), recording in its metadata how
    they are to be sampled (``krea2.trainer.inference.conditioning_record``), so
    ``krea2 dit sample`` uses the run's settings or refuses what it cannot rebuild."""
    from krea2.dit.model import Krea2DiT
    from krea2.dit.weights import save_weights
    from krea2.trainer.build import dit_config
    from krea2.trainer.config import load_job
    from krea2.trainer.inference import conditioning_record

    cfg = load_job(job_config)
    names = [st.name for st in cfg.stages]
    if stage is not None and stage not in names:
        raise UserError(f"stage {stage!r} is not a stage of {job_config}; its stages: {names}")
    spec = next((st for st in cfg.stages if st.name == stage), None)
    model = Krea2DiT(dit_config(cfg, spec))
    model.load_state_dict(state, strict=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_weights(model, str(out), conditioning=conditioning_record(cfg, spec))
    return out


def source_stage(sources: list[Path]) -> str | None:
    """The stage that checkpoint step folders ``<run>/checkpoints/<stage>/step-N`` come
    from, when they all name one; None otherwise (e.g. safetensors files)."""
    stages = {
        Path(s).parent.name
        for s in sources
        if Path(s).name.startswith("step-") and Path(s).parent.parent.name == "checkpoints"
    }
    return stages.pop() if len(stages) == 1 and len(sources) > 0 else None


def pma_from_run(run_dir: Path, stage: str, last: int, every: int, out: Path) -> list[int]:
    root = Path(run_dir) / "checkpoints" / stage
    steps = pma_steps(root, last, every)
    mgr = CheckpointManager(root)
    save_dit(average([mgr.path_of(s) for s in steps]), Path(run_dir) / "config.toml", out, stage)
    return steps


def refuse_untrusted_checkpoints(sources: list[Path], run_dir: Path, trusted: bool) -> None:
    """UserError for a torch.distributed checkpoint folder outside ``run_dir`` unless
    ``trusted``. Reading one unpickles its ``.metadata``, and a pickle can run code, so a
    checkpoint folder is trusted input (docs/trainer.md): the run's own are, any other needs
    the user's say-so. ``.safetensors`` files hold no code and are always accepted."""
    if trusted:
        return
    root = run_dir.resolve()
    for source in sources:
        if source.suffix == ".safetensors" or source.resolve().is_relative_to(root):
            continue
        raise UserError(
            f"{source} is a checkpoint folder from outside this run ({root}); loading one "
            "unpickles its metadata, which can run code. Pass --trust-checkpoints if you made "
            "it or trust who did, or merge .safetensors exports instead"
        )


def merge_to_file(
    sources: list[Path],
    weights: list[float] | None,
    job_config: Path,
    out: Path,
    stage: str | None = None,
    method: str = "average",
    base: Path | None = None,
    density: float = 0.2,
    scale: float = 1.0,
    trusted: bool = False,
) -> Path:
    """Merge ``sources`` into ``out`` by ``method``: ``average`` (uniform or weighted),
    ``ties`` (needs the ``base`` they were fine-tuned from; keeps the top ``density`` of each
    task vector) or ``task-arithmetic`` (``base`` + ``scale`` x the weighted sum of the
    task vectors). The stage whose settings are recorded is ``stage``, else the one the
    step folders name (see :func:`source_stage`). Checkpoint folders from outside the job's
    run folder are refused unless ``trusted`` (:func:`refuse_untrusted_checkpoints`)."""
    sources = [Path(s) for s in sources]
    from krea2.trainer.config import load_job

    run_dir = Path(load_job(job_config).run_dir)
    refuse_untrusted_checkpoints([*sources, *([Path(base)] if base else [])], run_dir, trusted)
    if method == "average":
        state = average(sources, weights)
    elif method in ("ties", "task-arithmetic"):
        if base is None:
            raise UserError(f"{method} merging needs the base checkpoint the sources started from")
        if method == "ties":
            state = ties_merge(Path(base), sources, weights, density)
        else:
            state = task_arithmetic(Path(base), sources, weights, scale)
    else:
        raise UserError(f"merge method {method!r} is not 'average', 'ties' or 'task-arithmetic'")
    return save_dit(state, job_config, out, stage or source_stage(sources))
