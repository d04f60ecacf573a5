"""Memory and FLOP model of a training step for FSDP x TP layouts (for planning krea2-12b).

Bytes per rank, by part (all assumptions stated, nothing measured here):

- parameters: fp32 master weights sharded over dp*tp ranks (TP splits the block
  matrices, FSDP shards everything over dp); the bf16 copy of one FSDP unit (a block,
  split by TP) is gathered at a time, two with prefetch.
- gradients: fp32, sharded like the parameters (reduce-scatter in fp32).
- optimizer: AdamW keeps two fp32 moments per parameter, Muon one momentum buffer.
- activations: per sample of L = text + image tokens, bf16. The dit TP plan keeps block
  inputs and norm outputs replicated (no sequence parallel), q/k/v/gate/MLP hidden states
  are split over TP. Full AC keeps one [L, D] block input per block plus one block's
  working set; selective keeps matmul and attention outputs; none keeps everything
  (about 1.6x selective, for norms, RoPE, SiLU and gates).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from krea2.dit.config import DiTConfig
from krea2.dit.flops import cost, param_count

GIB = 1024**3


@dataclass
class Layout:
    dp: int
    tp: int
    global_batch: int
    image_tokens: int
    text_tokens: int = 512
    checkpointing: str | None = "full"
    optimizer: str = "muon"

    @property
    def ranks(self) -> int:
        return self.dp * self.tp


@dataclass
class Projection:
    params: int
    train_flops_per_step: float
    step_seconds_at_mfu: float
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    gathered_unit_gib: float
    activations_gib: float

    @property
    def total_gib(self) -> float:
        return (
            self.params_gib
            + self.grads_gib
            + self.optimizer_gib
            + self.gathered_unit_gib
            + self.activations_gib
        )

    def as_dict(self) -> dict:
        return asdict(self) | {"total_gib": self.total_gib}


def _block_params(cfg: DiTConfig) -> int:
    d, hd = cfg.width, cfg.head_dim
    attn = d * cfg.heads * hd * (3 if cfg.attn_gate else 2) + 2 * d * cfg.kv_heads * hd
    return attn + 3 * d * cfg.mlp_hidden_size + 8 * d


def _activation_bytes_per_sample(cfg: DiTConfig, layout: Layout) -> float:
    seq = layout.text_tokens + layout.image_tokens
    d, tp, hd = cfg.width, layout.tp, cfg.head_dim
    split = (2 * cfg.heads * hd + 2 * cfg.kv_heads * hd + 2 * cfg.mlp_hidden_size) / tp
    replicated = 6 * d  # block input, two norm outputs, attention and MLP outputs, residual
    selective = 2 * seq * (split + replicated)  # bf16, per block
    if layout.checkpointing == "full":
        return 2 * seq * d * cfg.depth + selective
    if layout.checkpointing == "selective":
        return selective * cfg.depth
    return 1.6 * selective * cfg.depth


def project(
    cfg: DiTConfig, layout: Layout, peak_tflops: float = 989.0, mfu: float = 0.4
) -> Projection:
    """Per-rank memory (GiB) and step FLOPs/time of ``layout`` for ``cfg``."""
    p = param_count(cfg)
    shards = layout.ranks
    c = cost(
        cfg, layout.global_batch, layout.image_tokens, layout.text_tokens, layout.checkpointing
    )
    muon_share = cfg.depth * _block_params(cfg) / p if layout.optimizer == "muon" else 0.0
    opt_bytes = p * (4 * muon_share + 8 * (1 - muon_share))
    local_batch = layout.global_batch / layout.dp
    return Projection(
        params=p,
        train_flops_per_step=float(c.train_flops),
        step_seconds_at_mfu=c.train_flops / (shards * peak_tflops * 1e12 * mfu),
        params_gib=4 * p / shards / GIB,
        grads_gib=4 * p / shards / GIB,
        optimizer_gib=opt_bytes / shards / GIB,
        gathered_unit_gib=2 * 2 * _block_params(cfg) / layout.tp / GIB,
        activations_gib=local_batch * _activation_bytes_per_sample(cfg, layout) / GIB,
    )
