"""Checks of a whole job that need the world size or the model shape, run before any work."""

from __future__ import annotations

import glob
from pathlib import Path

from krea2.infra.errors import UserError
from krea2.trainer.config import Float8Recipe, JobConfig, ModelConfig, StageConfig


def resolve_files(patterns: list[str], what: str) -> list[Path]:
    """Expand Parquet files/globs in order (sorted within a glob); UserError when none match."""
    files: list[Path] = []
    for pattern in patterns:
        matched = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
        for m in matched:
            p = Path(m)
            if p.is_dir():
                files.extend(sorted(p.glob("*.parquet")))
            elif p.is_file():
                files.append(p)
            else:
                raise UserError(f"{what}: {m} does not exist; fix the path or the glob")
    if not files:
        raise UserError(f"{what}: {patterns} match no Parquet files")
    return files


def parallel_degrees(cfg: JobConfig, world_size: int) -> tuple[int, int]:
    """(dp, tp) of the mesh; UserError unless dp * tp == world_size."""
    tp = cfg.parallel.tp
    if tp < 1:
        raise UserError(f"parallel.tp={tp} must be >= 1")
    if cfg.parallel.dp == 0 and world_size % tp:
        raise UserError(
            f"parallel.tp={tp} does not divide the job's {world_size} rank(s); "
            f"choose a tp that divides {world_size}"
        )
    dp = cfg.parallel.dp or world_size // tp
    if dp * tp != world_size:
        raise UserError(
            f"parallel.dp={dp} x parallel.tp={tp} = {dp * tp} ranks, but the job has "
            f"{world_size}; set parallel.dp=0 (derived) and a tp that divides {world_size}"
        )
    return dp, tp


def cuda_float8_capable() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _check_stage(
    cfg: JobConfig, stage: StageConfig, index: int, dp: int, patch: int, ae_factor: int
) -> None:
    from krea2.trainer.objectives import check_stage_objective

    where = f"stage {stage.name!r}"
    check_stage_objective(stage, index, dp)
    if stage.style_from:
        from krea2.trainer.style_settings import style_origin

        try:
            style_origin(cfg.stages, index)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if not stage.data:
        raise UserError(f"{where} has no data; set stages[{index}].data = ['shards/*.parquet']")
    resolve_files(stage.data, f"{where} data")
    if stage.eval_data:
        resolve_files(stage.eval_data, f"{where} eval_data")
    if stage.batch_size % dp:
        raise UserError(
            f"{where}: batch_size={stage.batch_size} is not divisible by the {dp} data-parallel "
            f"ranks; use a multiple of {dp}"
        )
    factor = ae_factor * patch
    if stage.resolution % factor:
        raise UserError(
            f"{where}: resolution={stage.resolution} is not divisible by autoencoder factor x "
            f"patch = {factor}"
        )
    wants_fp8 = stage.float8 is not Float8Recipe.NONE and not stage.float8_emulate
    if wants_fp8 and not cuda_float8_capable():
        raise UserError(
            f"{where}: float8={stage.float8.value!r} needs an NVIDIA GPU with compute "
            "capability >= 8.9 (Ada/Hopper/Blackwell), and none is available; set "
            f"stages[{index}].float8 = 'none' (or float8_emulate = true for numerics tests)"
        )
    if stage.irepa.steps > 0:
        from krea2.trainer.model_shape import dit_config

        depth = dit_config(cfg).depth
        if not 0 <= stage.irepa.layer < depth:
            raise UserError(
                f"{where}: irepa.layer={stage.irepa.layer} is not a block of a {depth}-block DiT"
            )
        enc = stage.irepa.encoder
        if enc != "tiny" and not (enc.startswith("hf:") and Path(enc[3:]).exists()):
            raise UserError(
                f"{where}: irepa.encoder={enc!r}; use 'tiny' or 'hf:/local/path' to a vision model"
            )
    if stage.init_from not in ("previous", "none") and not Path(stage.init_from).exists():
        raise UserError(f"{where}: init_from={stage.init_from!r} does not exist")
    if cfg.parallel.async_tp and not stage.compile:
        raise UserError(f"{where}: async_tp works through torch.compile; set compile = true")
    if stage.lora.enabled:
        _check_lora_stage(cfg, stage, index, where)


def _check_lora_stage(cfg: JobConfig, stage: StageConfig, index: int, where: str) -> None:
    """What a LoRA stage cannot combine with: peft wraps the target Linears, which TP's
    plan and float8's conversion expect plain, and its base must come from somewhere."""
    if cfg.parallel.tp > 1:
        raise UserError(
            f"{where}: LoRA runs under FSDP only (the adapters wrap the Linears that tensor "
            "parallelism shards); set parallel.tp = 1 and shard the frozen base over dp"
        )
    if stage.float8 is not Float8Recipe.NONE:
        raise UserError(
            f"{where}: float8 training converts the Linears LoRA wraps; set "
            f"stages[{index}].float8 = 'none'"
        )
    if stage.init_from == "none" or (stage.init_from == "previous" and index == 0):
        raise UserError(
            f"{where}: LoRA trains adapters on a frozen base, but the stage starts from random "
            f"weights; set stages[{index}].init_from to released weights or a checkpoint"
        )


def _check_base_quant(cfg: JobConfig, world_size: int) -> None:
    """model.base_quant quantizes a LoRA stage's frozen base, on one device, kept in place."""
    mode = cfg.model.base_quant.value
    if mode == "none":
        return
    if not any(s.lora.enabled for s in cfg.stages):
        raise UserError(
            f"model.base_quant={mode!r} quantizes the frozen base of LoRA stages, but no stage "
            "trains LoRA; set stages.N.lora.rank or base_quant = 'none'"
        )
    if world_size > 1:
        raise UserError(
            f"model.base_quant={mode!r} runs on one device only ({world_size} ranks here); "
            "set base_quant = 'none' under FSDP"
        )
    if cfg.observe.second_base is not None:
        raise UserError(
            f"observe.second_base swaps the frozen base in place, which model.base_quant="
            f"{mode!r} stores quantized; remove one of them"
        )


def autoencoder_spec(model: ModelConfig) -> str:
    """``model.autoencoder`` as a ``krea2.dit`` registry name, with the older ``ae_factor``
    folded in (``pixel`` + ``ae_factor = F`` is ``pixel:F``). UserError on a conflict."""
    from krea2.dit.components import parse_autoencoder

    spec, factor = parse_autoencoder(model.autoencoder), model.ae_factor
    if factor is None:
        return str(spec)
    if spec.kind != "pixel":
        if factor == 1:  # saved configs of older runs carry the then-default 1 everywhere
            return str(spec)
        raise UserError(
            f"model.ae_factor={factor} applies to pixel only; {spec.kind!r} has its own "
            "factor (read from its config): remove model.ae_factor"
        )
    if spec.number not in (None, factor):
        raise UserError(
            f"model.autoencoder={model.autoencoder!r} and model.ae_factor={factor} disagree; "
            f"write autoencoder = 'pixel:{factor}' and remove ae_factor"
        )
    return f"pixel:{factor}"


def raise_problems(problems: list[str]) -> None:
    """One UserError holding every problem, one ``error:`` line each (repeats dropped)."""
    if problems:
        raise UserError("\nerror: ".join(dict.fromkeys(problems)))


def validate_job(cfg: JobConfig, world_size: int = 1) -> None:
    """Raise one UserError naming every problem of ``cfg`` for ``world_size`` ranks that
    config files can show (one line each; see :func:`job_problems`)."""
    raise_problems(job_problems(cfg, world_size))


def job_problems(cfg: JobConfig, world_size: int = 1) -> list[str]:
    """The problems of ``cfg``, one line each. A problem that leaves nothing to check
    against (no stages, a model or mesh that cannot be built, an autoencoder that cannot be
    read) is the only one reported; after it every check runs."""
    from krea2.dit.components import latent_space
    from krea2.dit.parallel import check_tp_degree
    from krea2.trainer.model_shape import dit_config, fit_problems

    try:
        if not cfg.stages:
            raise UserError("the job has no stages; add a [[stages]] table with data and steps")
        model_cfg = dit_config(cfg)
        dp, tp = parallel_degrees(cfg, world_size)
        if tp > 1:
            check_tp_degree(model_cfg, tp)
        spec = autoencoder_spec(cfg.model)
        ae = latent_space(spec)  # reads a VAE's config: UserError when its folder is not there
    except UserError as e:
        return [str(e)]
    problems = fit_problems(cfg, model_cfg, spec, ae.channels)

    checks = [lambda: _check_job_switches(cfg, tp, world_size)]
    checks += [
        lambda i=i, s=s: _check_stage(cfg, s, i, dp, dit_config(cfg, s).patch, ae.factor)
        for i, s in enumerate(cfg.stages)
    ]
    for check in checks:
        try:
            check()
        except UserError as e:
            problems.append(str(e))
    return problems


def _check_job_switches(cfg: JobConfig, tp: int, world_size: int) -> None:
    if cfg.parallel.async_tp and tp <= 2:
        raise UserError(f"parallel.async_tp needs tp > 2 (got tp={tp}); set async_tp = false")
    second = cfg.observe.second_base
    if second is not None:
        if not Path(second).exists():
            raise UserError(f"observe.second_base={second!r} does not exist; give released weights")
        if not any(s.lora.enabled for s in cfg.stages):
            raise UserError(
                "observe.second_base validates LoRA adapters on another base, but no stage "
                "trains LoRA; remove it or set stages.N.lora.rank"
            )
    _check_base_quant(cfg, world_size)
