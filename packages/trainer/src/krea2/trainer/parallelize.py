"""Apply parallelism to a plain model, torchtitan's order: float8 -> TP -> AC -> compile -> FSDP.

``krea2.dit`` knows nothing about distribution; it exposes its TP plan, FSDP units and
activation-checkpointing switch, and this module applies them on a ("dp", "tp") mesh.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from krea2.infra.logging import get_logger
from krea2.trainer.config import CheckpointingMode, Float8Recipe

log = get_logger("trainer.parallelize")

# Linears kept in high precision under float8: the first and last layers, the time and text
# MLPs and the tap projector are small or precision-sensitive (torchtitan filters likewise).
FLOAT8_SKIP = ("first", "last.linear", "tmlp.", "tproj.", "txtmlp.", "txtfusion.projector", "ttok")


def build_mesh(dp: int, tp: int, device_type: str) -> DeviceMesh:
    """A 2-D ("dp", "tp") mesh over every rank (requires an initialised process group)."""
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))


def float8_filter(module: nn.Module, fqn: str) -> bool:
    """True for Linears converted to float8: block matrices with both sides divisible by 16."""
    if not isinstance(module, nn.Linear) or any(fqn.startswith(s) for s in FLOAT8_SKIP):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_float8(model: nn.Module, recipe: Float8Recipe, emulate: bool, fsdp: bool) -> int:
    """Swap eligible Linears for torchao Float8Linear (weights stay high precision, so the
    state dict is unchanged); returns how many were converted."""
    if recipe is Float8Recipe.NONE:
        return 0
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe.value)
    # Tensorwise scales allow the FSDP all-gather itself to run in float8.
    all_gather = recipe is Float8Recipe.TENSORWISE and fsdp and not emulate
    config = dataclasses.replace(config, emulate=emulate, enable_fsdp_float8_all_gather=all_gather)
    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    convert_to_float8_training(model, module_filter_fn=float8_filter, config=config)
    after = sum(type(m) is nn.Linear for m in model.modules())
    log.info("float8 %s: converted %d Linears", recipe.value, before - after)
    return before - after


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, float8: Float8Recipe, async_tp: bool) -> None:
    """Megatron-style TP with the plan from ``krea2.dit.parallel.tp_plan``."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from krea2.dit.parallel import tp_plan

    plan = tp_plan(model, tp=tp_mesh.size())
    if float8 is Float8Recipe.TENSORWISE:
        # TP collectives in float8 for the converted Linears (tensorwise scales only).
        from torchao.float8.float8_linear import Float8Linear
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
        )

        for fqn, style in list(plan.items()):
            if isinstance(model.get_submodule(fqn), Float8Linear):
                kwargs = (
                    {"output_layouts": style.output_layouts[0]}
                    if hasattr(style, "output_layouts")
                    else {}
                )
                if isinstance(style, ColwiseParallel):
                    plan[fqn] = Float8ColwiseParallel(**kwargs)
                elif isinstance(style, RowwiseParallel):
                    plan[fqn] = Float8RowwiseParallel(**kwargs)
    parallelize_module(model, tp_mesh, plan)
    if async_tp:
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        torch._inductor.config._micro_pipeline_tp = True
        enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    log.info("tensor parallel over %d ranks (%d modules)", tp_mesh.size(), len(plan))


def apply_ac(model: nn.Module, mode: CheckpointingMode) -> None:
    from krea2.dit.checkpointing import set_activation_checkpointing

    set_activation_checkpointing(model, None if mode is CheckpointingMode.NONE else mode.value)


def apply_compile(model: nn.Module, backend: str) -> None:
    """torch.compile each block (one graph per block; recompiles only on new shapes)."""
    for block in model.blocks:
        block.compile(backend=backend, fullgraph=True)
    for block in [*model.txtfusion.layerwise_blocks, *model.txtfusion.refiner_blocks]:
        block.compile(backend=backend, fullgraph=True)


def apply_fsdp(
    modules: list[nn.Module],
    root: nn.Module,
    dp_mesh: DeviceMesh,
    param_dtype: torch.dtype | None,
) -> None:
    """fully_shard each unit then the root; bf16 params with fp32 gradient reduction on GPU."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for unit in modules:
        fully_shard(unit, mesh=dp_mesh, mp_policy=mp)
    fully_shard(root, mesh=dp_mesh, mp_policy=mp)


def sum_tp_partial_grads(params: list[nn.Parameter], tp_mesh: DeviceMesh) -> None:
    """All-reduce (sum) the gradients of ``params`` over the TP group, in place (the local
    shard under FSDP: summing is linear, so it commutes with FSDP's reduce-scatter)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    group = tp_mesh.get_group()
    grads = [p.grad for p in params if p.grad is not None]
    locals_ = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    if not locals_:
        return
    flat = torch.cat([t.reshape(-1) for t in locals_])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in locals_:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
