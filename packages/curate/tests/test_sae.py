"""The top-k SAE: it reconstructs sparse data, reports dead features, and tags by feature."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from krea2.curate.embed.sae import SaeConfig, codes, tag, top_images, train_sae


def sparse_data(n: int = 3000, dim: int = 32, atoms: int = 48, active: int = 3, seed: int = 0):
    """Each row: ``active`` of ``atoms`` unit directions with positive weights."""
    rng = np.random.default_rng(seed)
    dictionary = rng.normal(size=(atoms, dim))
    dictionary /= np.linalg.norm(dictionary, axis=1, keepdims=True)
    idx = np.stack([rng.choice(atoms, active, replace=False) for _ in range(n)])
    weights = rng.uniform(0.5, 1.5, (n, active))
    x = np.einsum("na,nad->nd", weights, dictionary[idx])
    return x.astype(np.float32), idx


def test_a_topk_sae_explains_sparse_data_with_k_active_features():
    x, _ = sparse_data()
    sae, stats = train_sae(x, SaeConfig(features=64, k=4, steps=600, batch=256))
    assert stats["l0"] == 4.0
    assert stats["fvu"] < 0.15, stats
    assert 0 <= stats["dead_features"] < 64 and stats["max_frequency"] <= 1.0
    z = codes(sae, x)
    assert ((z > 0).sum(1) == 4).all()


def test_dead_features_are_counted():
    x, _ = sparse_data(n=500, atoms=4, active=1)
    _, stats = train_sae(x, SaeConfig(features=128, k=1, steps=200, batch=128))
    # Four directions cannot keep 128 one-hot features alive.
    assert stats["dead_features"] >= 64 and stats["dead_share"] >= 0.5, stats


def test_tags_are_the_dominant_features_and_top_images_follow_them():
    z = np.array([[0.0, 2.0, 0.5], [1.0, 0.0, 0.0], [0.0, 0.1, 3.0]], np.float32)
    assert tag(z, top=2) == [[1, 2], [0], [2, 1]]
    assert top_images(z, 2, n=5).tolist() == [2, 0]
    assert top_images(z, 0).tolist() == [1]
