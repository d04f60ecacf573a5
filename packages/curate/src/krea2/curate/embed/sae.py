"""A top-k sparse autoencoder on image embeddings: features that tag images without a
classifier per artifact (the report's SAE tagging, §2.3).

``x̂ = W_dec · topk(ReLU(W_enc · (x − b_dec) + b_enc)) + b_dec``: exactly ``k`` features are
active per image (Gao et al. 2024's top-k SAE; no L1 term to tune), decoder columns are kept
at unit norm so an activation is a feature's weight in the image. ``train_sae`` reports what
decides whether a dictionary is usable: the fraction of variance left unexplained (FVU),
dead features (never active on the data) and how often each feature fires. ``tag`` gives
each image its dominant features; ``top_images`` a feature's most activating images, which
a VLM names (``krea2.curate.vlm``) and a person can filter by.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class SaeConfig:
    """``features``: dictionary size; ``k``: active features per image; ``steps`` of
    ``batch`` rows, Adam at ``lr``."""

    features: int = 256
    k: int = 8
    steps: int = 2000
    batch: int = 512
    lr: float = 1e-3
    seed: int = 0
    threads: int = 1  # torch intra-op threads (small matrices: more threads only contend)


class TopKSae(nn.Module):
    """embeddings (b, d) → (reconstruction (b, d), sparse codes (b, features))."""

    def __init__(self, dim: int, features: int, k: int) -> None:
        super().__init__()
        self.k = k
        self.enc = nn.Linear(dim, features)
        self.dec = nn.Linear(features, dim)
        with torch.no_grad():  # tied initialisation, a common start for SAEs
            self.dec.weight.copy_(F.normalize(self.enc.weight.T, dim=0))
            self.enc.bias.zero_()

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.enc(x - self.dec.bias))
        top = pre.topk(self.k, dim=1)
        return torch.zeros_like(pre).scatter_(1, top.indices, top.values)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encode(x)
        return self.dec(z), z

    def normalize_decoder(self) -> None:
        with torch.no_grad():
            self.dec.weight.copy_(F.normalize(self.dec.weight, dim=0))


@torch.inference_mode()
def codes(sae: TopKSae, x: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """(n, d) embeddings → (n, features) float32 sparse codes."""
    xt = torch.from_numpy(np.asarray(x, np.float32))
    return torch.cat([sae.encode(xt[i : i + chunk]) for i in range(0, len(xt), chunk)]).numpy()


@torch.inference_mode()
def sae_stats(sae: TopKSae, x: np.ndarray) -> dict[str, float]:
    """FVU, dead features and activation frequencies of ``sae`` on (n, d) ``x``."""
    xt = torch.from_numpy(np.asarray(x, np.float32))
    recon, z = sae(xt)
    fvu = float(((xt - recon) ** 2).sum() / ((xt - xt.mean(0)) ** 2).sum())
    freq = (z > 0).float().mean(0)
    return {
        "fvu": fvu,
        "l0": float((z > 0).sum(1).float().mean()),
        "dead_features": int((freq == 0).sum()),
        "dead_share": float((freq == 0).float().mean()),
        "max_frequency": float(freq.max()),
    }


def train_sae(x: np.ndarray, config: SaeConfig | None = None) -> tuple[TopKSae, dict]:
    """Train a top-k SAE on (n, d) embeddings; returns (the SAE, stats on ``x`` with the
    training time and the final loss)."""
    c = config or SaeConfig()
    previous = torch.get_num_threads()
    torch.set_num_threads(c.threads)
    try:
        return _train(x, c)
    finally:
        torch.set_num_threads(previous)


def _train(x: np.ndarray, c: SaeConfig) -> tuple[TopKSae, dict]:
    torch.manual_seed(c.seed)
    gen = torch.Generator().manual_seed(c.seed)
    xt = torch.from_numpy(np.asarray(x, np.float32))
    sae = TopKSae(xt.shape[1], c.features, c.k)
    with torch.no_grad():  # start the decoder bias at the data's mean
        sae.dec.bias.copy_(xt.mean(0))
    opt = torch.optim.Adam(sae.parameters(), lr=c.lr)
    start = time.perf_counter()
    loss = torch.zeros(())
    for _ in range(c.steps):
        batch = xt[torch.randint(0, len(xt), (min(c.batch, len(xt)),), generator=gen)]
        recon, _ = sae(batch)
        loss = F.mse_loss(recon, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sae.normalize_decoder()
    sae.eval()
    stats = sae_stats(sae, x) | {"seconds": time.perf_counter() - start, "loss": loss.item()}
    return sae, stats


def tag(z: np.ndarray, top: int = 3) -> list[list[int]]:
    """Each image's ``top`` most active features (by activation, active ones only)."""
    order = np.argsort(-z, axis=1)[:, :top]
    return [[int(f) for f in row if z[i, f] > 0] for i, row in enumerate(order)]


def top_images(z: np.ndarray, feature: int, n: int = 8) -> np.ndarray:
    """Indices of the ``n`` images where ``feature`` is most active (active ones only)."""
    col = z[:, feature]
    order = np.argsort(-col)[:n]
    return order[col[order] > 0]
