"""Image embedders and the embedding store (needs the ``embed`` extra: torch, transformers).

>>> from krea2.curate import embed
>>> e = embed.load_embedder("toy:/tmp/toy-encoder")      # or siglip2:DIR, dinov3:DIR, sscd:FILE
>>> vectors = e.embed(images)                            # (n, dim) float16, unit rows
>>> refs = embed.write_batch(Path("/tmp/emb"), keys, vectors)
>>> embed.read_vectors(refs, keys)                       # the same vectors back

Nothing here imports torch until a loader or the trainer is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.curate.embed.embedder import Embedder as Embedder
    from krea2.curate.embed.embedder import TorchEmbedder as TorchEmbedder
    from krea2.curate.embed.embedder import l2_normalize as l2_normalize
    from krea2.curate.embed.embedder import resize_batch as resize_batch
    from krea2.curate.embed.loaders import KINDS as KINDS
    from krea2.curate.embed.loaders import load_embedder as load_embedder
    from krea2.curate.embed.loaders import require_weights as require_weights
    from krea2.curate.embed.ssl import SslConfig as SslConfig
    from krea2.curate.embed.ssl import train_toy_encoder as train_toy_encoder
    from krea2.curate.embed.store import read_vectors as read_vectors
    from krea2.curate.embed.store import write_batch as write_batch
    from krea2.curate.embed.toy import ToyEncoder as ToyEncoder
    from krea2.curate.embed.toy import ToyEncoderConfig as ToyEncoderConfig
    from krea2.curate.embed.toy import save_toy_encoder as save_toy_encoder

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
