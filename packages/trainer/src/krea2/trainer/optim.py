"""Optimizers: AdamW, or torch.optim.Muon on hidden matrices with AdamW on everything else."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from krea2.trainer.config import OptimizerConfig, OptimizerName
from krea2.trainer.distributed import cpu_has_fast_bf16

# Hidden matrices of the transformer blocks (Muon's domain). First match wins; everything
# else (patch embed `first`, `last.linear`, time and text MLPs, the tap projector, norm
# scales, modulation tables, biases, embeddings, the iREPA projector) goes to AdamW, as
# Muon's authors prescribe for input/output layers, gains and biases.
MUON_PATTERN = re.compile(
    r"^(dit\.)?(blocks|txtfusion\.(layerwise|refiner)_blocks)\.\d+\."
    r"(attn\.(wq|wk|wv|gate|wo)|mlp\.(gate|up|down))\.weight$"
)
NORM_PATTERN = re.compile(r"(^|\.)(scale|qnorm\.scale|knorm\.scale)$")

log = logging.getLogger(__name__)


def split_parameters(named: Iterable[tuple[str, nn.Parameter]], muon: bool) -> dict[str, list]:
    """Partition trainable parameters (exhaustive, disjoint) into named groups:
    ``muon`` (2-D hidden matrices; empty unless ``muon``), ``norms`` (zero-centered RMSNorm
    scales), ``decay`` (other matrices), ``no_decay`` (vectors: biases, tables)."""
    groups: dict[str, list] = {"muon": [], "norms": [], "decay": [], "no_decay": []}
    for name, p in named:
        if not p.requires_grad:
            continue
        if muon and MUON_PATTERN.match(name) and p.ndim == 2:
            groups["muon"].append((name, p))
        elif NORM_PATTERN.search(name):
            groups["norms"].append((name, p))
        elif p.ndim >= 2:
            groups["decay"].append((name, p))
        else:
            groups["no_decay"].append((name, p))
    return groups


def build_optimizers(
    named: list[tuple[str, nn.Parameter]], cfg: OptimizerConfig, lr: float
) -> list[torch.optim.Optimizer]:
    """One AdamW (three groups), plus one Muon when ``cfg.name`` is muon.

    Each group stores its peak ``base_lr``; :func:`set_lr` scales it by the schedule.
    Muon uses Nesterov momentum and ``adjust_lr_fn="match_rms_adamw"`` (update RMS of
    AdamW's, 0.2 sqrt(max(A, B))), so one learning rate serves both optimizers.
    """
    use_muon = cfg.name is OptimizerName.MUON
    groups = split_parameters(named, use_muon)
    adam_groups = [
        {
            "params": [p for _, p in groups["decay"]],
            "weight_decay": cfg.weight_decay,
            "name": "decay",
        },
        {"params": [p for _, p in groups["no_decay"]], "weight_decay": 0.0, "name": "no_decay"},
        {
            "params": [p for _, p in groups["norms"]],
            "weight_decay": cfg.norm_weight_decay,
            "name": "norms",
        },
    ]
    adam_groups = [g for g in adam_groups if g["params"]]
    for g in adam_groups:
        g["base_lr"] = lr
    # foreach=False: under FSDP+TP the AdamW parameters live on two meshes (TP'd matrices
    # on ("dp", "tp"), replicated norms/tables on "dp"), which one foreach kernel cannot mix.
    opts: list[torch.optim.Optimizer] = [
        torch.optim.AdamW(adam_groups, lr=lr, betas=cfg.betas, eps=cfg.eps, foreach=False)
    ]
    if use_muon and groups["muon"]:
        device = groups["muon"][0][1].device
        if device.type == "cpu" and not cpu_has_fast_bf16():
            # torch.optim.Muon runs Newton-Schulz in bf16, slower than fp32 on such a CPU:
            # measured 1.5 s per step for 20 matrices of 512x128 (AdamW: milliseconds).
            log.warning(
                "Muon on a CPU without fast bf16 (AMX, AMD avx512_bf16) is slow (its "
                "Newton-Schulz iteration is bf16); use optimizer.name = 'adamw' for CPU runs"
            )
        muon_lr = cfg.muon_lr if cfg.muon_lr is not None else lr
        muon = torch.optim.Muon(
            [p for _, p in groups["muon"]],
            lr=muon_lr,
            weight_decay=cfg.weight_decay,
            momentum=cfg.muon_momentum,
            nesterov=True,
            adjust_lr_fn="match_rms_adamw",
        )
        muon.param_groups[0]["base_lr"] = muon_lr
        muon.param_groups[0]["name"] = "muon"
        opts.append(muon)
    return opts


def set_lr(optimizers: list[torch.optim.Optimizer], factor: float) -> float:
    """Set every group's lr to ``base_lr * factor``; returns the first group's lr."""
    for opt in optimizers:
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * factor
    return optimizers[0].param_groups[0]["lr"]


def _norm(t: Tensor) -> Tensor:
    n = torch.linalg.vector_norm(t.float() if not isinstance(t, DTensor) else t, 2)
    return n.full_tensor() if isinstance(n, DTensor) else n


def clip_grad_norm(params: list[Tensor], max_norm: float) -> float:
    """Global L2 norm of all gradients (DTensors on any mesh, or plain), clipped in place
    to ``max_norm`` when > 0. Norms are grouped per mesh so each group costs one reduction."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    by_mesh: dict[object, list[Tensor]] = {}
    for g in grads:
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        by_mesh.setdefault(key, []).append(g)
    total_sq = torch.zeros((), dtype=torch.float64)
    for key, group in by_mesh.items():
        if key is None:
            n = torch.linalg.vector_norm(torch.stack([_norm(g) for g in group]), 2)
        else:
            n = torch.nn.utils.get_total_norm(group, 2.0, foreach=False)
            n = n.full_tensor() if isinstance(n, DTensor) else n
        total_sq += n.detach().double().cpu() ** 2
    total = float(total_sq.sqrt())
    if max_norm > 0 and total > max_norm and total == total:
        coef = max_norm / (total + 1e-6)
        for g in grads:
            g.mul_(coef)
    return total
