"""Text conditioning for training: captions -> tapped states [B, T, taps, dim] and a mask."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import torch
from torch import Tensor, nn

from krea2.infra.errors import UserError
from krea2.trainer.cache import EncoderCache, module_fingerprint

_WORD = re.compile(r"[a-z0-9]+")
EMPTY_TOKEN = "<empty>"


def word_ids(text: str, vocab_size: int, max_tokens: int) -> list[int]:
    """Lower-cased words hashed (crc32, stable across processes) into ``vocab_size - 1``
    buckets shifted by one; id 0 is the empty caption's token, so no row is all padding."""
    words = _WORD.findall(text.lower())[:max_tokens]
    if not words:
        return [0]
    return [1 + zlib.crc32(w.encode()) % (vocab_size - 1) for w in words]


class WordConditioner(nn.Module):
    """A learned word table fanned out over the DiT's text taps (the toy recipe).

    Each tap is the word embedding times a fixed near-identity random matrix, so the taps
    differ (as encoder layers do) while carrying the same words. Trained with the DiT.
    """

    def __init__(self, vocab_size: int, dim: int, taps: int, max_tokens: int, seed: int = 0):
        super().__init__()
        self.vocab_size, self.max_tokens = vocab_size, max_tokens
        self.table = nn.Embedding(vocab_size, dim)
        nn.init.normal_(self.table.weight, std=1.0)
        g = torch.Generator().manual_seed(seed)
        mix = torch.eye(dim) + 0.1 * torch.randn(taps, dim, dim, generator=g) / dim**0.5
        self.register_buffer("taps_mix", mix, persistent=False)

    def tokenize(
        self, texts: list[str], device: torch.device | str = "cpu"
    ) -> tuple[Tensor, Tensor]:
        """(ids [B, T] int64, mask [B, T] bool) with T = max_tokens for every batch, so every
        rank and step sees one shape (no recompiles, no uneven work)."""
        rows = [word_ids(t, self.vocab_size, self.max_tokens) for t in texts]
        length = self.max_tokens
        ids = torch.zeros(len(rows), length, dtype=torch.long)
        mask = torch.zeros(len(rows), length, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = True
        return ids.to(device), mask.to(device)

    def forward(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """Captions -> (txt [B, T, taps, dim], mask [B, T])."""
        device = self.table.weight.device
        ids, mask = self.tokenize(texts, device)
        emb = self.table(ids)  # [B, T, dim]
        txt = torch.einsum("btd,kde->btke", emb, self.taps_mix.to(emb.dtype))
        return txt, mask


class FrozenEncoder(nn.Module):
    """A frozen ``krea2.dit.text.TextEncoder`` (Qwen3-VL) whose embeddings are cached by
    (encoder fingerprint, caption): ``cache_size`` captions in memory, and all of them on
    disk under ``cache_dir/<fingerprint>/`` when set (:class:`krea2.trainer.cache.EncoderCache`)."""

    def __init__(self, encoder, cache_size: int = 0, cache_dir: str | Path | None = None):
        super().__init__()
        self.encoder = encoder
        for p in self.encoder.parameters() if isinstance(encoder, nn.Module) else ():
            p.requires_grad_(False)
        fp = module_fingerprint(encoder) if cache_size > 0 or cache_dir is not None else ""
        self.cache = EncoderCache(fp, cache_size, cache_dir)

    @torch.no_grad()
    def forward(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        if not self.cache.enabled:
            return self.encoder.encode(texts)

        def encode(rows: list[int]) -> list[tuple[Tensor, Tensor]]:
            txt, mask = self.encoder.encode([texts[i] for i in rows])
            return list(zip(txt, mask, strict=True))

        cached = self.cache.lookup(texts, encode)
        device = self.encoder.device if hasattr(self.encoder, "device") else "cpu"
        txt, mask = torch.stack([c[0] for c in cached]), torch.stack([c[1] for c in cached])
        return txt.to(device), mask.to(device)


LEARNED = "words"  # the trainer's own text conditioner; every other name is krea2.dit's


def text_encoder_spec(cfg) -> str:
    """``cfg.encoder`` (TextConfig) with the older ``path`` field folded in: ``qwen3-vl`` +
    ``path`` is ``qwen3-vl:PATH``. Raises UserError on an unknown name or a conflict."""
    from krea2.dit.components import parse_text_encoder

    if cfg.encoder == LEARNED:
        return LEARNED
    if cfg.path is not None:
        if ":" in cfg.encoder:
            raise UserError(
                f"text.encoder={cfg.encoder!r} names its path already; remove text.path"
            )
        spec = parse_text_encoder(f"{cfg.encoder}:{cfg.path}", also=[LEARNED])
    else:
        spec = parse_text_encoder(cfg.encoder, also=[LEARNED])
    return str(spec)


def build_text(cfg, dit_cfg, seed: int, cache_dir: str | Path | None = None) -> nn.Module:
    """The job's text conditioner (``cfg``: TextConfig; ``dit_cfg``: the DiT's config); a
    frozen encoder's embeddings are cached on disk under ``cache_dir`` when given."""
    spec = text_encoder_spec(cfg)
    if spec == LEARNED:
        return WordConditioner(
            cfg.vocab_size, dit_cfg.text_dim, dit_cfg.text_taps, cfg.max_tokens, seed
        )
    from krea2.dit.components import load_text_encoder  # transformers; a local model

    encoder = load_text_encoder(spec, dit_cfg, cfg.max_tokens)
    return FrozenEncoder(encoder, cfg.cache_size, cache_dir)
