"""A small MLP head over image features: fitted with torch, run with numpy, saved as .npz."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


class MlpHead:
    """``logits(x)``: standardize ``x`` ``[B, D]`` with ``mean``/``std`` ``[D]``, then linear
    layers (``weight`` ``[out, in]``, ``bias`` ``[out]``) with ReLU between them → ``[B]``.
    ``meta`` is a JSON-able dict saved with the weights (what the head was trained on)."""

    def __init__(
        self,
        mean: np.ndarray,
        std: np.ndarray,
        layers: list[tuple[np.ndarray, np.ndarray]],
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)
        self.layers = [(np.asarray(w, np.float32), np.asarray(b, np.float32)) for w, b in layers]
        self.meta = dict(meta or {})

    def logits(self, x: np.ndarray) -> np.ndarray:
        h = (np.asarray(x, np.float32) - self.mean) / self.std
        for i, (w, b) in enumerate(self.layers):
            h = h @ w.T + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        return h[:, 0]

    def save(self, path: str | Path) -> Path:
        """Write the head to ``path`` (``.npz``), atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {"mean": self.mean, "std": self.std}
        for i, (w, b) in enumerate(self.layers):
            arrays[f"w{i}"], arrays[f"b{i}"] = w, b
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(self.meta)), **arrays)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> MlpHead:
        """Read a head written by :meth:`save`; a missing or unreadable file raises
        ValueError naming the path."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                n = sum(1 for k in data.files if k.startswith("w"))
                layers = [(data[f"w{i}"], data[f"b{i}"]) for i in range(n)]
                return cls(data["mean"], data["std"], layers, json.loads(str(data["meta"])))
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"cannot read a reward head from {path}: {e}") from None


def _torch_mlp(dim: int, hidden: int, seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(dim, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )


def _to_head(net: Any, mean: np.ndarray, std: np.ndarray, meta: dict[str, Any]) -> MlpHead:
    linears = [m for m in net if hasattr(m, "weight")]
    layers = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in linears]
    return MlpHead(mean, std, layers, meta)


def _standardizer(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x.mean(axis=0), np.maximum(x.std(axis=0), 1e-6)


def fit_classifier(
    x: np.ndarray,
    y: np.ndarray,
    *,
    hidden: int = 32,
    epochs: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-4,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
) -> MlpHead:
    """Fit a binary classifier head on ``x`` ``[N, D]`` and labels ``y`` ``[N]`` in {0, 1}
    (full-batch Adam on the logistic loss); ``logits`` then estimate log-odds of 1."""
    import torch

    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    mean, std = _standardizer(x)
    net = _torch_mlp(x.shape[1], hidden, seed)
    xt, yt = torch.from_numpy((x - mean) / std), torch.from_numpy(y)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(xt)[:, 0], yt)
        loss.backward()
        opt.step()
    return _to_head(net, mean, std, {**(meta or {}), "loss": float(loss.detach())})


def fit_bradley_terry(
    x_winners: np.ndarray,
    x_losers: np.ndarray,
    *,
    hidden: int = 32,
    epochs: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-4,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
) -> MlpHead:
    """Fit a scalar head ``f`` on pairs (``x_winners[i]`` preferred over ``x_losers[i]``,
    each ``[N, D]``) with the Bradley-Terry loss ``-log σ(f(w) - f(l))``."""
    import torch

    xw, xl = np.asarray(x_winners, np.float32), np.asarray(x_losers, np.float32)
    if xw.shape != xl.shape:
        raise ValueError(f"winners {xw.shape} and losers {xl.shape} must pair up one to one")
    mean, std = _standardizer(np.concatenate([xw, xl]))
    net = _torch_mlp(xw.shape[1], hidden, seed)
    tw, tl = torch.from_numpy((xw - mean) / std), torch.from_numpy((xl - mean) / std)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.softplus(-(net(tw) - net(tl))).mean()
        loss.backward()
        opt.step()
    return _to_head(net, mean, std, {**(meta or {}), "loss": float(loss.detach())})
