"""Embedders from local paths at tiny random configs: SigLIP-2, DINOv3, SSCD, the toy encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from krea2.curate.embed import load_embedder, resize_batch  # noqa: E402
from krea2.curate.embed.loaders import image_processor  # noqa: E402
from krea2.infra.errors import UserError  # noqa: E402


def images(n: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (40 + 3 * i, 52, 3), dtype=np.uint8) for i in range(n)]


def unit(x: torch.Tensor) -> np.ndarray:
    return torch.nn.functional.normalize(x.float(), dim=1).numpy()


@pytest.fixture(scope="module")
def siglip2_dir(tmp_path_factory) -> Path:
    from transformers import Siglip2Config, Siglip2Model
    from transformers.models.siglip2 import Siglip2ImageProcessorPil

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("siglip2")
    text = dict(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    vision = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        patch_size=8,
        num_patches=16,
    )
    Siglip2Model(Siglip2Config(text_config=text, vision_config=vision)).save_pretrained(path)
    Siglip2ImageProcessorPil(patch_size=8, max_num_patches=16).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def dinov3_dir(tmp_path_factory) -> Path:
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("dinov3")
    cfg = DINOv3ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        patch_size=8,
        image_size=32,
        num_register_tokens=2,
    )
    DINOv3ViTModel(cfg).save_pretrained(path)
    return path


class TinySscd(torch.nn.Module):
    """SSCD's I/O contract at toy size: a conv trunk, GeM pooling, a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Conv2d(3, 8, 3, stride=4)
        self.proj = torch.nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.relu(self.trunk(x)).clamp_min(1e-6)
        gem = f.pow(3).mean(dim=(2, 3)).pow(1.0 / 3)
        return self.proj(gem)


def test_siglip2_gives_the_models_own_normalised_image_features(siglip2_dir):
    from transformers import AutoModel

    emb = load_embedder(f"siglip2:{siglip2_dir}", batch_size=2)
    got = emb.embed(images())
    assert got.shape == (5, 32) and got.dtype == np.float16
    model = AutoModel.from_pretrained(siglip2_dir).eval()
    inputs = image_processor(siglip2_dir)(images=images(), return_tensors="pt")
    with torch.inference_mode():
        want = unit(model.get_image_features(**inputs).pooler_output)
    np.testing.assert_allclose(got.astype(np.float32), want, atol=2e-3)


def test_dinov3_gives_the_normalised_cls_token(dinov3_dir):
    from transformers import AutoModel

    got = load_embedder(f"dinov3:{dinov3_dir}", batch_size=3).embed(images())
    model = AutoModel.from_pretrained(dinov3_dir).eval()
    pixels = resize_batch(images(), (32, 32), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    with torch.inference_mode():
        want = unit(model(pixel_values=pixels).pooler_output)
    np.testing.assert_allclose(got.astype(np.float32), want, atol=2e-3)


def test_sscd_torchscript_loads_and_finds_its_output_size(tmp_path):
    torch.manual_seed(0)
    module = TinySscd().eval()
    path = tmp_path / "sscd.torchscript.pt"
    torch.jit.script(module).save(str(path))
    emb = load_embedder(f"sscd:{path}")
    assert emb.dim == 16
    got = emb.embed(images())
    pixels = resize_batch(images(), (320, 320), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    with torch.inference_mode():
        want = unit(module(pixels))
    np.testing.assert_allclose(got.astype(np.float32), want, atol=2e-3)


def test_batch_size_and_dtype_change_nothing_but_precision(dinov3_dir):
    full = load_embedder(f"dinov3:{dinov3_dir}", batch_size=64).embed(images())
    small = load_embedder(f"dinov3:{dinov3_dir}", batch_size=1).embed(images())
    bf16 = load_embedder(f"dinov3:{dinov3_dir}", dtype="bfloat16", batch_size=2).embed(images())
    np.testing.assert_allclose(small.astype(np.float32), full.astype(np.float32), atol=2e-3)
    assert bf16.dtype == np.float16
    np.testing.assert_allclose(np.linalg.norm(bf16.astype(np.float32), axis=1), 1.0, atol=2e-3)
    cos = (bf16.astype(np.float32) * full.astype(np.float32)).sum(1)
    assert cos.min() > 0.97, cos


def test_the_toy_encoder_loads_with_its_threshold(tmp_path):
    from krea2.curate.embed import ToyEncoder, ToyEncoderConfig, save_toy_encoder

    save_toy_encoder(ToyEncoder(ToyEncoderConfig(side=32, dim=24, threshold=0.83)), tmp_path)
    emb = load_embedder(f"toy:{tmp_path}")
    assert (emb.dim, emb.threshold) == (24, 0.83)
    assert emb.embed(images()).shape == (5, 24)
    assert emb.embed([]).shape == (0, 24)


@pytest.mark.parametrize("kind", ["siglip2", "dinov3", "toy"])
def test_a_directory_without_weights_is_a_clear_user_error(kind, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r"has no weights \(.*safetensors.* missing\).*never"):
        load_embedder(f"{kind}:{tmp_path}")
    with pytest.raises(UserError, match="is not a directory"):
        load_embedder(f"{kind}:{tmp_path / 'absent'}")


def test_bad_specs_and_bad_files_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="KIND:PATH"):
        load_embedder("clip:/models/x")
    with pytest.raises(UserError, match="KIND:PATH"):
        load_embedder("/models/x")
    junk = tmp_path / "sscd.pt"
    junk.write_bytes(b"not a torchscript archive")
    with pytest.raises(UserError, match="not a TorchScript model"):
        load_embedder(f"sscd:{junk}")
    with pytest.raises(UserError, match="not a TorchScript file"):
        load_embedder(f"sscd:{tmp_path}")
