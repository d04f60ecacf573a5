"""Image embedders by name, loaded from local paths only: ``KIND:PATH``.

- ``siglip2:DIR`` — a SigLIP-2 (or SigLIP) checkpoint saved by transformers
  (``config.json``, ``model.safetensors``, ``preprocessor_config.json``); the image tower's
  pooled output (the attention-pooling head), through the checkpoint's own image processor.
- ``dinov3:DIR`` — a DINOv3 ViT checkpoint saved by transformers; the normalised CLS token
  (``pooler_output``), inputs resized to the configured size with the processor's
  mean/std (ImageNet's when it has none).
- ``sscd:FILE`` — an SSCD TorchScript descriptor (``model(batch) -> (b, d)``), inputs
  squashed to 320×320 with ImageNet mean/std, as its authors batch them.
- ``toy:DIR`` — the toy encoder trained on the pool (``krea2.curate.embed.ssl``).

Nothing is ever downloaded (``local_files_only``); a path without weights is a user error
naming what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from krea2.curate.embed.embedder import TorchEmbedder, resize_batch
from krea2.infra.errors import UserError

KINDS = ("siglip2", "dinov3", "sscd", "toy")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SSCD_SIDE = 320


def parse_spec(spec: str) -> tuple[str, Path]:
    """``KIND:PATH`` → (kind, path); a user error names the accepted kinds."""
    kind, sep, path = spec.partition(":")
    if not sep or kind not in KINDS or not path:
        raise UserError(f"embedder {spec!r} must be KIND:PATH with KIND one of {list(KINDS)}")
    return kind, Path(path).expanduser()


def require_weights(kind: str, path: Path, weights: tuple[str, ...] = WEIGHT_FILES) -> None:
    """Fail with one clear message unless directory ``path`` holds a config and weights."""
    if not path.is_dir():
        raise UserError(
            f"{kind} embedder: {path} is not a directory (save the model there "
            "with save_pretrained, or give the right path)"
        )
    missing = [] if (path / "config.json").is_file() else ["config.json"]
    if not any((path / w).is_file() for w in weights):
        missing.append(" or ".join(weights))
    if missing:
        raise UserError(
            f"{kind} embedder: {path} has no weights ({', '.join(missing)} missing); "
            "weights are never downloaded, so copy the checkpoint there first"
        )


def load_embedder(
    spec: str, device: str = "cpu", dtype: str = "float32", batch_size: int = 64
) -> TorchEmbedder:
    """The embedder named by ``spec`` (``KIND:PATH``), on ``device`` in ``dtype``."""
    kind, path = parse_spec(spec)
    loader = {"siglip2": _siglip2, "dinov3": _dinov3, "sscd": _sscd, "toy": _toy}[kind]
    emb = loader(path, device, dtype)
    emb.batch_size = batch_size
    return emb


def _torch_dtype(dtype: str) -> Any:
    import torch

    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise UserError(f"dtype {dtype!r} is not a torch dtype (use float32, bfloat16, float16)")
    return getattr(torch, dtype)


def image_processor(path: Path) -> Any:
    """The checkpoint's image processor, as its PIL/numpy class: transformers' default
    classes need torchvision, which curate does not install."""
    import transformers

    name = json.loads((path / "preprocessor_config.json").read_text()).get(
        "image_processor_type", ""
    )
    base = name.removesuffix("Fast")
    cls = getattr(transformers, f"{base}Pil", None) or getattr(transformers, base, None)
    if cls is None:
        raise UserError(
            f"{path}/preprocessor_config.json names image processor {name!r}, "
            "which this transformers does not have"
        )
    return cls.from_pretrained(path, local_files_only=True)


def _siglip2(path: Path, device: str, dtype: str) -> TorchEmbedder:
    from transformers import AutoModel

    require_weights("siglip2", path)
    if not (path / "preprocessor_config.json").is_file():
        raise UserError(
            f"siglip2 embedder: {path} has no preprocessor_config.json (SigLIP-2 "
            "needs its own image processor; save it beside the model)"
        )
    model = AutoModel.from_pretrained(path, dtype=_torch_dtype(dtype), local_files_only=True)
    model = model.to(device).eval()
    processor = image_processor(path)
    vision_cfg = getattr(model.config, "vision_config", model.config)
    tower = model.get_image_features if hasattr(model, "get_image_features") else model

    def forward(inputs: dict) -> Any:
        return tower(**inputs).pooler_output

    def preprocess(images: Any) -> Any:
        return dict(processor(images=list(images), return_tensors="pt"))

    return TorchEmbedder(
        f"siglip2:{path}", vision_cfg.hidden_size, forward, preprocess, device, dtype
    )


def _dinov3(path: Path, device: str, dtype: str) -> TorchEmbedder:
    from transformers import AutoModel

    require_weights("dinov3", path)
    model = AutoModel.from_pretrained(path, dtype=_torch_dtype(dtype), local_files_only=True)
    model = model.to(device).eval()
    side = int(getattr(model.config, "image_size", 224))
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    if (proc := path / "preprocessor_config.json").is_file():
        raw = json.loads(proc.read_text())
        mean, std = raw.get("image_mean", mean), raw.get("image_std", std)
        size = raw.get("size") or {}
        side = int(size.get("height", size.get("shortest_edge", side)))

    def forward(pixels: Any) -> Any:
        return model(pixel_values=pixels).pooler_output

    def preprocess(images: Any) -> Any:
        return resize_batch(images, (side, side), mean, std)

    return TorchEmbedder(
        f"dinov3:{path}", model.config.hidden_size, forward, preprocess, device, dtype
    )


def _sscd(path: Path, device: str, dtype: str) -> TorchEmbedder:
    import torch

    if not path.is_file():
        raise UserError(
            f"sscd embedder: {path} is not a TorchScript file (e.g. "
            "sscd_disc_mixup.torchscript.pt; weights are never downloaded)"
        )
    try:
        model = torch.jit.load(str(path), map_location=device)
    except RuntimeError as exc:
        raise UserError(f"sscd embedder: {path} is not a TorchScript model: {exc}") from None
    model = model.to(_torch_dtype(dtype)).eval()
    with torch.inference_mode():  # SSCD models do not record their output size
        probe = torch.zeros(1, 3, SSCD_SIDE, SSCD_SIDE, device=device, dtype=_torch_dtype(dtype))
        dim = int(model(probe).shape[-1])

    def preprocess(images: Any) -> Any:
        return resize_batch(images, (SSCD_SIDE, SSCD_SIDE), IMAGENET_MEAN, IMAGENET_STD)

    return TorchEmbedder(f"sscd:{path}", dim, model, preprocess, device, dtype)


def _toy(path: Path, device: str, dtype: str) -> TorchEmbedder:
    from krea2.curate.embed.toy import WEIGHTS_FILE, load_toy_encoder

    require_weights("toy", path, (WEIGHTS_FILE,))
    model = load_toy_encoder(path).to(device, _torch_dtype(dtype))
    side = model.config.side

    def preprocess(images: Any) -> Any:
        return resize_batch(images, (side, side))

    return TorchEmbedder(
        f"toy:{path}",
        model.config.dim,
        model,
        preprocess,
        device,
        dtype,
        threshold=model.config.threshold,
    )
