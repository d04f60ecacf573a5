"""Image embedders and the embedding store (needs the ``embed`` extra: torch, transformers).

>>> from krea2.curate import embed
>>> e = embed.load_embedder("toy:/tmp/toy-encoder")      # or siglip2:DIR, dinov3:DIR, sscd:FILE
>>> vectors = e.embed(images)                            # (n, dim) float16, unit rows
>>> refs = embed.write_batch(Path("/tmp/emb"), keys, vectors)
>>> embed.read_vectors(refs, keys)                       # the same vectors back

Nothing here imports torch until a loader or the trainer is used.
"""

from __future__ import annotations

from krea2.infra.lazy import lazy_exports

_HOMES: dict[str, str] = {
    "Embedder": "embedder",
    "TorchEmbedder": "embedder",
    "l2_normalize": "embedder",
    "resize_batch": "embedder",
    "KINDS": "loaders",
    "load_embedder": "loaders",
    "require_weights": "loaders",
    "write_batch": "store",
    "read_vectors": "store",
    "ToyEncoder": "toy",
    "ToyEncoderConfig": "toy",
    "save_toy_encoder": "toy",
    "SslConfig": "ssl",
    "train_toy_encoder": "ssl",
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
