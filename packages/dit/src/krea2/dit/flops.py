"""Parameter and FLOP counts of a DiT config (matmuls and attention, as FlopCounterMode counts)."""

from __future__ import annotations

from dataclasses import dataclass

from krea2.dit.config import DiTConfig


@dataclass
class Cost:
    """Parameters and FLOPs (multiply-add = 2) for one forward at a given batch and size."""

    params: int
    forward_flops: int
    train_flops: int  # forward + backward (2x forward) + recomputation under AC

    def as_dict(self) -> dict:
        return {
            "params": self.params,
            "forward_flops": self.forward_flops,
            "train_flops": self.train_flops,
        }


def param_count(cfg: DiTConfig) -> int:
    """Exact parameter count from the config (no model built). krea2-12b: 12,820,073,036."""
    d, hd, td = cfg.width, cfg.head_dim, cfg.text_dim

    def block(dim: int, heads: int, kv: int, hidden: int, hdim: int) -> int:
        attn = dim * heads * hdim * (3 if cfg.attn_gate else 2) + 2 * dim * kv * hdim
        return attn + 2 * hdim + 3 * dim * hidden + 2 * dim

    n = cfg.in_channels * d + d  # first
    n += cfg.time_dim * d + d + d * d + d  # tmlp
    n += (6 * d * d + 6 * d) if cfg.modulated else (cfg.timestep_tokens * d * (d + 1))
    tblock = block(
        td, cfg.text_heads, cfg.text_kv_heads, cfg.text_mlp_hidden_size, cfg.text_head_dim
    )
    n += (cfg.layerwise_blocks + cfg.refiner_blocks) * tblock + cfg.text_taps
    n += td + td * d + d + d * d + d  # txtmlp
    mblock = block(d, cfg.heads, cfg.kv_heads, cfg.mlp_hidden_size, hd)
    n += cfg.depth * (mblock + (6 * d if cfg.modulated else 0))
    n += d + d * cfg.in_channels + cfg.in_channels + (2 * d if cfg.modulated else 0)  # last
    return n


def _block_flops(
    tokens: int,
    seq: int,
    dim: int,
    heads: int,
    kv: int,
    hidden: int,
    hd: int,
    gate: bool,
    queries: int | None = None,
) -> int:
    """FLOPs of one block over `tokens` total tokens in sequences of length `seq`.

    `queries` (default all) of the tokens get outputs: k/v run on every token, the rest
    (q, gate, wo, MLP, attention rows) on the queries only.
    """
    queries = tokens if queries is None else queries
    rows = dim * heads * hd * (3 if gate else 2) + 3 * dim * hidden
    attn = 4 * seq * heads * hd  # QK^T and PV per query token
    return 2 * tokens * 2 * dim * kv * hd + 2 * queries * rows + queries * attn


def _main_blocks_flops(cfg: DiTConfig, text_tokens: int, image_tokens: int) -> int:
    """All single-stream blocks of one sample; the last one computes no text rows."""
    seq = text_tokens + image_tokens + cfg.timestep_tokens
    kw = dict(
        seq=seq,
        dim=cfg.width,
        heads=cfg.heads,
        kv=cfg.kv_heads,
        hidden=cfg.mlp_hidden_size,
        hd=cfg.head_dim,
        gate=cfg.attn_gate,
    )
    full = _block_flops(seq, **kw)
    return (cfg.depth - 1) * full + _block_flops(seq, queries=seq - text_tokens, **kw)


def extra_token_flops(
    cfg: DiTConfig, extra_tokens: int, image_tokens: int, text_tokens: int = 512, batch: int = 1
) -> int:
    """FLOPs one forward's single-stream blocks add for `extra_tokens` more non-image tokens
    (style tokens: keys in every block, queries in all but the last, like text)."""
    more = _main_blocks_flops(cfg, text_tokens + extra_tokens, image_tokens)
    return batch * (more - _main_blocks_flops(cfg, text_tokens, image_tokens))


def forward_flops(cfg: DiTConfig, batch: int, image_tokens: int, text_tokens: int = 512) -> int:
    """FLOPs of one forward for `batch` samples of `image_tokens` + `text_tokens` tokens."""
    d, td, t, n = cfg.width, cfg.text_dim, text_tokens, image_tokens
    f = 2 * n * cfg.in_channels * d  # first
    f += 2 * (cfg.time_dim * d + d * d)  # tmlp, one token
    f += 2 * 6 * d * d if cfg.modulated else 2 * cfg.timestep_tokens * d * d
    tb = dict(
        dim=td,
        heads=cfg.text_heads,
        kv=cfg.text_kv_heads,
        hidden=cfg.text_mlp_hidden_size,
        hd=cfg.text_head_dim,
        gate=cfg.attn_gate,
    )
    f += cfg.layerwise_blocks * _block_flops(t * cfg.text_taps, cfg.text_taps, **tb)
    f += 2 * t * td * cfg.text_taps  # projector (taps -> 1, per channel)
    f += cfg.refiner_blocks * _block_flops(t, t, **tb)
    f += 2 * t * (td * d + d * d)  # txtmlp
    f += _main_blocks_flops(cfg, t, n)
    f += 2 * n * d * cfg.in_channels  # last
    return batch * f


def cost(
    cfg: DiTConfig,
    batch: int,
    image_tokens: int,
    text_tokens: int = 512,
    checkpointing: str | None = None,
) -> Cost:
    """Parameters, forward FLOPs and training-step FLOPs (about 3x forward; full AC re-runs
    the blocks' forward once more). Equal to torch's FlopCounterMode on the model."""
    fwd = forward_flops(cfg, batch, image_tokens, text_tokens)
    # Backward is 2x forward, less the input gradients nobody needs (patch embed, time MLP).
    d = cfg.width
    train = 3 * fwd - 2 * batch * (image_tokens * cfg.in_channels * d + cfg.time_dim * d)
    if checkpointing == "full":
        train += batch * _main_blocks_flops(cfg, text_tokens, image_tokens)
    return Cost(param_count(cfg), fwd, train)


FLOP_UNITS = ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP"))


def format_flops(flops: float) -> str:
    """A FLOP count in the largest unit it reaches: 3.41e9 -> '3.41 GFLOP', 120 -> '120 FLOP'."""
    for scale, unit in FLOP_UNITS:
        if abs(flops) >= scale:
            return f"{flops / scale:,.2f} {unit}"
    return f"{flops:,.0f} FLOP"
