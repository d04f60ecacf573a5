"""Classifier distillation: a VLM's labels on a sample → a small head on frozen embeddings.

The report's recipe for an in-house filter (§2.3): a large VLM labels a sample with a task
prompt, and a small classifier on DINOv3/SigLIP-2 features runs at scale. Here:

- ``LabelTask``: the question and its labels; ``parse`` accepts ``{"label": "yes"}`` (the
  prompt asks for it, a code fence around it is fine) or the bare label, anything else is
  garbage (a ``ValueError``, which ``VlmClient.ask_many`` answers by asking again).
- ``pseudo_label``: one label or one exception per image, through any ``VlmClient``.
- ``train_head``: logistic regression (L-BFGS, L2) on a training split of the embeddings,
  Platt calibration on a second split, precision/recall/F1 and expected calibration error
  on a third that neither saw. The head is a JSON file (weights, bias, calibration) that
  scores float16 embeddings with numpy alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from krea2.curate.vlm import VlmClient, image_question


@dataclass(frozen=True)
class LabelTask:
    """A labelling question; ``positive`` is the label the head predicts."""

    name: str
    question: str
    labels: tuple[str, ...] = ("yes", "no")
    positive: str = "yes"

    def prompt(self) -> str:
        choices = ", ".join(f'"{label}"' for label in self.labels)
        return f'{self.question}\nAnswer with JSON only: {{"label": one of {choices}}}.'

    def parse(self, answer: str) -> str:
        """The label in ``answer``; a ``ValueError`` for anything else."""
        text = re.sub(r"^```(?:json)?|```$", "", answer.strip()).strip()
        try:
            value = json.loads(text)
            label = value.get("label") if isinstance(value, dict) else value
        except json.JSONDecodeError:
            label = text
        label = str(label).strip().strip('."').lower()
        if label not in self.labels:
            raise ValueError(f"{answer[:80]!r} is not one of {list(self.labels)}")
        return label


def pseudo_label(
    client: VlmClient, images: Sequence[np.ndarray], task: LabelTask, garbage_retries: int = 2
) -> list[str | Exception]:
    """The VLM's label of each (h, w, 3) uint8 image, or the exception that stopped it."""
    requests = [image_question(im, task.prompt()) for im in images]
    return client.ask_many(requests, task.parse, garbage_retries)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3) -> tuple[np.ndarray, float]:
    """Weights (d,) and bias of L2-regularised logistic regression on (n, d) ``x``, (n,) 0/1
    ``y``, with classes weighted equally (a rare positive class is not ignored)."""
    from scipy.optimize import minimize

    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    pos = max(1.0, y.sum())
    sw = np.where(y > 0, 0.5 / pos, 0.5 / max(1.0, len(y) - y.sum()))

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:-1], theta[-1]
        z = x @ w + b
        # log(1 + e^z) − y·z, stable for large |z|
        nll = np.logaddexp(0.0, z) - y * z
        g = sw * (_sigmoid(z) - y)
        value = float(sw @ nll + 0.5 * l2 * w @ w)
        return value, np.r_[x.T @ g + l2 * w, g.sum()]

    res = minimize(loss, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B")
    return res.x[:-1], float(res.x[-1])


def platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, c) of ``sigmoid(a·z + c)`` fitted to 0/1 ``y`` on logits ``z`` (Platt scaling)."""
    from scipy.optimize import minimize

    def loss(t: np.ndarray) -> float:
        return _log_loss(_sigmoid(t[0] * z + t[1]), y)

    a, c = minimize(loss, np.array([1.0, 0.0]), method="Nelder-Mead").x
    return float(a), float(c)


def expected_calibration_error(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Mean |confidence − accuracy| over ``bins`` equal-width probability bins, weighted
    by how many predictions fall in each."""
    edges = np.minimum((p * bins).astype(int), bins - 1)
    err = 0.0
    for b in range(bins):
        m = edges == b
        if m.any():
            err += m.mean() * abs(p[m].mean() - y[m].mean())
    return float(err)


@dataclass(frozen=True)
class LinearHead:
    """A calibrated logistic head: ``p = sigmoid(a·(x·w + b) + c)`` for unit embeddings x."""

    task: str
    weights: tuple[float, ...]
    bias: float
    scale: float = 1.0
    shift: float = 0.0

    def proba(self, x: np.ndarray) -> np.ndarray:
        """(n, d) embeddings → (n,) calibrated probability of the task's positive label."""
        z = np.asarray(x, np.float32) @ np.asarray(self.weights, np.float32) + self.bias
        return _sigmoid(self.scale * z + self.shift)

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: Path) -> LinearHead:
        raw = json.loads(Path(path).read_text())
        return cls(**{**raw, "weights": tuple(raw["weights"])})


def scores(p: np.ndarray, y: np.ndarray, at: float = 0.5) -> dict[str, float]:
    """Precision, recall and F1 of ``p >= at`` against 0/1 ``y``."""
    pred = p >= at
    tp = float((pred & (y > 0)).sum())
    precision = tp / pred.sum() if pred.sum() else 1.0
    recall = tp / (y > 0).sum() if (y > 0).sum() else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def split_indices(
    n: int, seed: int = 0, fractions: tuple[float, float] = (0.6, 0.2)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, calibration, held-out) row indices: a seeded shuffle cut at ``fractions``."""
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(fractions[0] * n), int((fractions[0] + fractions[1]) * n)
    return order[:a], order[a:b], order[b:]


def train_head(
    task: str,
    x: np.ndarray,
    y: np.ndarray,
    seed: int = 0,
    fractions: tuple[float, float] = (0.6, 0.2),
    l2: float = 1e-3,
) -> tuple[LinearHead, dict]:
    """Fit on a ``fractions[0]`` split, calibrate on the next ``fractions[1]``, report on the
    rest (held out from both). ``x`` (n, d) embeddings, ``y`` (n,) 0/1 pseudo-labels.
    Returns (the head, {n per split, held-out precision/recall/F1, ECE before and after
    calibration})."""
    y = np.asarray(y, np.float64)
    n = len(y)
    tr, cal, te = split_indices(n, seed, fractions)
    if min(len(tr), len(cal), len(te)) == 0 or len(np.unique(y[tr])) < 2:
        raise ValueError(
            f"{n} labels with {int(y.sum())} positives cannot fill three splits "
            "with both classes in training; label more images"
        )
    x = np.asarray(x, np.float32)
    w, bias = fit_logistic(x[tr], y[tr], l2)
    raw = LinearHead(task, tuple(map(float, w)), bias)
    scale, shift = platt(x[cal] @ w + bias, y[cal])
    head = LinearHead(task, raw.weights, bias, scale, shift)
    p_raw, p = raw.proba(x[te]), head.proba(x[te])
    report = {
        "train": len(tr),
        "calibration": len(cal),
        "held_out": len(te),
        "held_out_positives": int(y[te].sum()),
        **scores(p, y[te]),
        "ece_uncalibrated": expected_calibration_error(p_raw, y[te]),
        "ece": expected_calibration_error(p, y[te]),
    }
    return head, report
