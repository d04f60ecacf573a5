"""Memory per GPU of fine-tuning a DiT config: LoRA on a frozen base (bf16, int8 or float8
storage) or full fine-tuning, sharded with FSDP over N GPUs (a projection from the config,
nothing measured; ``krea2 train memory`` prints the table docs/trainer.md holds).

Per GPU, in GiB (2**30 bytes):

- base: the DiT weights at the storage width (bf16 2 B, int8/float8 1 B per parameter plus
  one fp32 scale per output row), sharded over N. Full fine-tuning keeps fp32 master
  weights (4 B) instead; float8 full fine-tuning (torchao Float8Linear) keeps them too, the
  float8 casts happen per matmul, so it is the bf16 row's memory.
- gathered: the unsharded working copy of the FSDP units in flight, two blocks (the one
  computing and the one prefetched) at the storage width, plus one dequantized bf16 Linear
  for int8/float8 bases.
- trainable state: LoRA adapters (rank r on every block's attention and MLP projections:
  r * (in + out) each; fp32 weight, gradient and two AdamW moments: 16 B) or, for full
  fine-tuning, every weight's fp32 gradient and two AdamW moments (12 B; its fp32 master
  is the base column), sharded.
- activations: ``krea2.trainer.projection``'s model with full activation checkpointing,
  ``batch`` samples per GPU (a frozen base still needs them: gradients flow through it to
  the adapters of earlier blocks).
- encoders: the frozen Qwen3-VL-4B (4.44e9 parameters) and VAE (1.3e8) in bf16, replicated
  on every GPU (zero when text embeddings and latents are cached ahead of training).
- runtime: CUDA context, NCCL buffers and allocator fragmentation, a flat 4 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from krea2.dit.config import DiTConfig
from krea2.dit.flops import param_count
from krea2.trainer.projection import GIB, Layout, _activation_bytes_per_sample, _block_params

BASE_BYTES = {"bf16": 2.0, "int8": 1.0, "float8": 1.0}
ENCODER_PARAMS = 4.44e9 + 1.3e8  # Qwen3-VL-4B + the Qwen-Image VAE
RUNTIME_GIB = 4.0
H200_GIB = 141e9 / GIB  # 141 GB of HBM3e


@dataclass(frozen=True)
class FinetuneMemory:
    """GiB per GPU by part (see the module docstring)."""

    method: str  # "lora" or "full"
    base: str  # storage of the base weights: bf16, int8, float8
    gpus: int
    base_gib: float
    gathered_gib: float
    trainable_gib: float
    activations_gib: float
    encoders_gib: float
    runtime_gib: float = RUNTIME_GIB

    @property
    def total_gib(self) -> float:
        return (
            self.base_gib
            + self.gathered_gib
            + self.trainable_gib
            + self.activations_gib
            + self.encoders_gib
            + self.runtime_gib
        )

    def fits(self, capacity_gib: float = H200_GIB) -> bool:
        return self.total_gib <= capacity_gib


def lora_params(cfg: DiTConfig, rank: int) -> int:
    """Adapter parameters for rank ``rank`` on every block's wq, wk, wv, gate, wo and
    SwiGLU gate, up, down (the default ``lora.targets``)."""
    d, hd, h = cfg.width, cfg.head_dim, cfg.mlp_hidden_size
    q_out, kv_out = cfg.heads * hd, cfg.kv_heads * hd
    shapes = [(d, q_out), (d, kv_out), (d, kv_out), (q_out, d)]
    if cfg.attn_gate:
        shapes.append((d, q_out))
    shapes += [(d, h), (d, h), (h, d)]
    return cfg.depth * sum(rank * (i + o) for i, o in shapes)


def finetune_memory(
    cfg: DiTConfig,
    method: str,
    base: str,
    gpus: int,
    side: int = 1024,
    batch: int = 1,
    rank: int = 64,
    text_tokens: int = 512,
    cached_conditioning: bool = False,
) -> FinetuneMemory:
    """Per-GPU memory of ``method`` ("lora" or "full") with the base stored as ``base``
    (bf16, int8, float8) on ``gpus`` FSDP ranks, ``batch`` images of ``side``^2 pixels
    (VAE factor 8, patch 2) per GPU. Full fine-tuning of an int8 base is refused."""
    if base not in BASE_BYTES:
        raise ValueError(f"base {base!r} is not one of {list(BASE_BYTES)}")
    if method == "full" and base == "int8":
        raise ValueError("full fine-tuning trains the weights; an int8 base cannot be trained")
    p = param_count(cfg)
    width = BASE_BYTES[base]
    unit = _block_params(cfg)
    if method == "lora":
        base_bytes = p * width + (cfg.depth * 8 * cfg.width * 4 if width < 2 else 0)
        trainable = lora_params(cfg, rank) * (4 + 4 + 8)
        gathered = 2 * unit * width + (2 * cfg.width * cfg.mlp_hidden_size if width < 2 else 0)
    elif method == "full":
        base_bytes = 4.0 * p  # fp32 master weights (bf16 and float8 alike)
        trainable = p * (4 + 8)
        gathered = 2 * unit * 2.0
    else:
        raise ValueError(f"method {method!r} is not 'lora' or 'full'")
    tokens = (side // 16) ** 2
    layout = Layout(dp=gpus, tp=1, global_batch=batch * gpus, image_tokens=tokens,
                    text_tokens=text_tokens, checkpointing="full")  # fmt: skip
    encoders = 0.0 if cached_conditioning else 2.0 * ENCODER_PARAMS
    return FinetuneMemory(
        method=method,
        base=base,
        gpus=gpus,
        base_gib=base_bytes / gpus / GIB,
        gathered_gib=gathered / GIB,
        trainable_gib=trainable / gpus / GIB,
        activations_gib=batch * _activation_bytes_per_sample(cfg, layout) / GIB,
        encoders_gib=encoders / GIB,
    )


def memory_table(
    cfg: DiTConfig, gpus=(1, 8, 64), side: int = 1024, rank: int = 64, batch: int = 1
) -> str:
    """The Markdown table of :func:`finetune_memory` for LoRA (bf16, int8, float8 bases)
    and full fine-tuning (bf16, float8) on each GPU count, with whether it fits an H200."""
    rows = [("lora", b) for b in ("bf16", "int8", "float8")] + [
        ("full", "bf16"),
        ("full", "float8"),
    ]
    head = (
        "| method | base | GPUs | base | gathered | trainable state | activations "
        "| encoders | runtime | total GiB/GPU | fits an H200 |"
    )
    lines = [head, "|" + " --- |" * 11]
    for method, base in rows:
        name = f"LoRA r{rank}" if method == "lora" else "full"
        for n in gpus:
            m = finetune_memory(cfg, method, base, n, side, batch, rank)
            fits = "yes" if m.fits() else "no"
            lines.append(
                f"| {name} | {base} | {n} | {m.base_gib:.1f} | {m.gathered_gib:.2f} "
                f"| {m.trainable_gib:.2f} | {m.activations_gib:.2f} | {m.encoders_gib:.1f} "
                f"| {m.runtime_gib:.0f} | **{m.total_gib:.1f}** | {fits} |"
            )
    return "\n".join(lines)
