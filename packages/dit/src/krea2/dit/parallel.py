"""Plans for the trainer: FSDP wrapping units and the tensor-parallel plan (applied elsewhere).

Nothing here creates process groups or shards anything; `krea2.trainer` applies these
(torchtitan's split: TP -> activation checkpointing -> compile -> FSDP).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from krea2.dit.config import DiTConfig
from krea2.infra.errors import UserError


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """Modules to `fully_shard` one by one, inner first; the root (model) is sharded last.

    Every single-stream block and every text-fusion block is its own unit; the embeddings,
    timestep MLPs and final layer stay with the root.
    """
    units: list[nn.Module] = [*model.txtfusion.layerwise_blocks, *model.txtfusion.refiner_blocks]
    units += list(model.blocks)
    return units


def check_tp_degree(cfg: DiTConfig, tp: int) -> None:
    """Raise UserError unless every head group splits evenly over `tp` ranks."""
    need = {
        "heads": cfg.heads,
        "kv_heads": cfg.kv_heads,
        "text_heads": cfg.text_heads,
        "text_kv_heads": cfg.text_kv_heads,
        "mlp_hidden": cfg.mlp_hidden_size,
        "text_mlp_hidden": cfg.text_mlp_hidden_size,
        "width": cfg.width,
    }
    for name, n in need.items():
        if n % tp:
            ok = [d for d in range(1, tp + 1) if all(v % d == 0 for v in need.values())]
            raise UserError(
                f"tensor-parallel degree {tp} does not divide {name}={n} of config "
                f"{cfg.name!r}; use one of {ok}"
            )


def _attn_mlp_plan(prefix: str, gate: bool) -> dict[str, ParallelStyle]:
    # Column-wise q/k/v/gate give each rank a contiguous slice of query heads and the matching
    # KV heads (head j uses KV head j // group, and groups stay within a slice when both head
    # counts divide by tp); the attention code reads head counts from the local shapes.
    plan: dict[str, ParallelStyle] = {
        f"{prefix}.attn.wq": ColwiseParallel(),
        f"{prefix}.attn.wk": ColwiseParallel(),
        f"{prefix}.attn.wv": ColwiseParallel(),
        f"{prefix}.attn.wo": RowwiseParallel(),
        f"{prefix}.mlp.gate": ColwiseParallel(),
        f"{prefix}.mlp.up": ColwiseParallel(),
        f"{prefix}.mlp.down": RowwiseParallel(),
    }
    if gate:
        plan[f"{prefix}.attn.gate"] = ColwiseParallel()
    return plan


def tp_plan(model: nn.Module, tp: int | None = None) -> dict[str, ParallelStyle]:
    """`parallelize_module` plan covering every Linear (fqn -> style), outputs replicated.

    Paired linears are colwise then rowwise (attention q/k/v/gate -> wo, SwiGLU gate/up ->
    down, tmlp.0 -> tmlp.2, txtmlp.1 -> txtmlp.3). Single linears whose output every rank
    needs (`first`, `tproj.1`, `last.linear`, `ttok`) are colwise with a replicated output.
    `txtfusion.projector` (12 -> 1) is too small to split and stays replicated.
    """
    cfg: DiTConfig = model.cfg
    if tp is not None:
        check_tp_degree(cfg, tp)
    gathered = ColwiseParallel(output_layouts=Replicate())
    plan: dict[str, ParallelStyle] = {
        "first": gathered,
        "tmlp.0": ColwiseParallel(),
        "tmlp.2": RowwiseParallel(),
        "txtmlp.1": ColwiseParallel(),
        "txtmlp.3": RowwiseParallel(),
        "last.linear": gathered,
    }
    plan["tproj.1" if cfg.modulated else "ttok"] = gathered
    for prefix in _attention_blocks(model):
        plan.update(_attn_mlp_plan(prefix, cfg.attn_gate))
    return plan


def tp_partial_params(model: nn.Module) -> list[nn.Parameter]:
    """Replicated parameters inside the TP-sharded region whose gradients are partial sums
    over each rank's heads: the QK-norm scales of every block in `tp_plan` (they act per
    head, after the colwise q/k). The trainer sums their gradients over the TP group after
    backward. Trainable ones only, in a fixed order (the same on every rank)."""
    blocks = _attention_blocks(model).values()
    return [p for blk in blocks for p in blk.attn.qknorm.parameters() if p.requires_grad]


def _attention_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """fqn -> block, for every block with attention + MLP (text fusion, then single stream)."""
    blocks = {}
    for kind in ("layerwise_blocks", "refiner_blocks"):
        for i, blk in enumerate(getattr(model.txtfusion, kind)):
            blocks[f"txtfusion.{kind}.{i}"] = blk
    for i, blk in enumerate(model.blocks):
        blocks[f"blocks.{i}"] = blk
    return blocks
