"""A small MLP head over image features: fitted with torch, run with numpy, saved as .npz;
and the reward kinds scored by one (:class:`HeadReward`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

import numpy as np

from krea2.rl.rewards.contract import RewardOutput, check_batch, empty_output
from krea2.rl.rewards.features import image_features


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


def fit_head(
    inputs: Sequence[np.ndarray],
    loss: Callable[..., Any],
    *,
    hidden: int = 32,
    epochs: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-4,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
) -> MlpHead:
    """Fit a head of one ``hidden`` layer (seeded with ``seed``) by full-batch Adam: the
    arrays of ``inputs`` (each ``[N_i, D]``) are standardized together, and
    ``loss(*outputs)`` (the net's ``[N_i, 1]`` output on each, in order; a scalar tensor)
    is minimized for ``epochs`` steps. ``meta`` and the last loss are saved with the head."""
    import torch

    xs = [np.asarray(x, np.float32) for x in inputs]
    mean, std = _standardizer(np.concatenate(xs))
    net = _torch_mlp(xs[0].shape[1], hidden, seed)
    ts = [torch.from_numpy((x - mean) / std) for x in xs]
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        opt.zero_grad()
        value = loss(*(net(t) for t in ts))
        value.backward()
        opt.step()
    return _to_head(net, mean, std, {**(meta or {}), "loss": float(value.detach())})


def fit_classifier(x: np.ndarray, y: np.ndarray, **options: Any) -> MlpHead:
    """Fit a binary classifier head on ``x`` ``[N, D]`` and labels ``y`` ``[N]`` in {0, 1}
    (the logistic loss; ``options``: :func:`fit_head`'s); ``logits`` then estimate
    log-odds of 1."""
    import torch

    target = torch.from_numpy(np.asarray(y, np.float32))
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    return fit_head([x], lambda out: bce(out[:, 0], target), **options)


def fit_bradley_terry(x_winners: np.ndarray, x_losers: np.ndarray, **options: Any) -> MlpHead:
    """Fit a scalar head ``f`` on pairs (``x_winners[i]`` preferred over ``x_losers[i]``,
    each ``[N, D]``) with the Bradley-Terry loss ``-log σ(f(w) - f(l))`` (``options``:
    :func:`fit_head`'s)."""
    import torch

    shapes = np.shape(x_winners), np.shape(x_losers)
    if shapes[0] != shapes[1]:
        raise ValueError(f"winners {shapes[0]} and losers {shapes[1]} must pair up one to one")
    softplus = torch.nn.functional.softplus
    return fit_head([x_winners, x_losers], lambda w, l_: softplus(-(w - l_)).mean(), **options)


class HeadReward:
    """A reward scored by an :class:`MlpHead` over
    :func:`~krea2.rl.rewards.features.image_features` (prompts are checked but not used):
    a subclass sets ``name`` and its ``sub_scores`` and turns the head's logits ``[B]`` into
    its output in :meth:`from_logits`."""

    name: str
    sub_scores: tuple[str, ...] = ()

    def __init__(self, head: MlpHead) -> None:
        self.head = head

    @classmethod
    def load(cls, path: str | Path) -> Self:
        return cls(MlpHead.load(path))

    @classmethod
    def fitted(cls, head: MlpHead, path: str | Path | None = None) -> Self:
        """The reward of a newly fitted ``head``, saved to ``path`` when given."""
        reward = cls(head)
        if path is not None:
            reward.save(path)
        return reward

    def save(self, path: str | Path) -> Path:
        return self.head.save(path)

    def __call__(self, images: Any, prompts: Sequence[str]) -> RewardOutput:
        pixels, prompts = check_batch(images, prompts)
        if not prompts:
            return empty_output(self.sub_scores)
        return self.from_logits(self.head.logits(image_features(pixels)))

    def from_logits(self, logits: np.ndarray) -> RewardOutput:
        raise NotImplementedError
