"""Text fusion: attention across the tapped-layer axis, a learned layer mix, token refiners."""

from __future__ import annotations

from torch import Tensor, nn

from krea2.dit.blocks import TextFusionBlock
from krea2.dit.config import DiTConfig


class TextFusion(nn.Module):
    """[B, T, taps, text_dim] tapped encoder states -> [B, T, text_dim] fused text features.

    `layerwise_blocks` attend over the taps of each token (unmasked), `projector`
    (Linear taps -> 1, no bias) mixes the taps, `refiner_blocks` attend over tokens with
    the text key-padding mask.
    """

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()

        def block() -> TextFusionBlock:
            return TextFusionBlock(
                cfg.text_dim,
                cfg.text_heads,
                cfg.text_kv_heads,
                cfg.text_mlp_hidden_size,
                cfg.norm_eps,
                cfg.attn_gate,
            )

        self.layerwise_blocks = nn.ModuleList(block() for _ in range(cfg.layerwise_blocks))
        self.projector = nn.Linear(cfg.text_taps, 1, bias=False)
        self.refiner_blocks = nn.ModuleList(block() for _ in range(cfg.refiner_blocks))

    def forward(self, txt: Tensor, mask: Tensor | None = None) -> Tensor:
        """txt [B, T, taps, C]; mask bool [B, 1, 1, T] or None -> [B, T, C]."""
        b, t, taps, c = txt.shape
        x = txt.reshape(b * t, taps, c)
        for blk in self.layerwise_blocks:
            x = blk(x)
        # contiguous: on a strided input torch's matmul folds the batch into one mm only when
        # the weight requires grad, so a frozen copy (a preference reference) would take bmm
        # and round differently from the policy it must equal at the start.
        x = self.projector(x.reshape(b, t, taps, c).transpose(-1, -2).contiguous()).squeeze(-1)
        for blk in self.refiner_blocks:
            x = blk(x, mask)
        return x
