"""GGUF weights (krea2.dit.gguf_weights): `krea2 dit convert --to gguf` writes the krea2
layout (released names, small and modulation tensors in F32, the rest in the chosen type),
reads back dequantized with its config and conditioning, and samples close to the source
with `krea2 dit sample --weights X.gguf`; bad files are clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from krea2.dit.cli import app
from krea2.dit.conditioning_record import check_conditioning
from krea2.dit.gguf_weights import gguf_tensor_types, read_gguf, save_gguf
from krea2.dit.weights import read_checkpoint, read_conditioning
from krea2.infra.errors import UserError

BIG = "blocks.0.mlp.up.weight"  # 64 x 32 in the tiny config: over the 1024 values kept F32
RECORD = {"text_encoder": "tiny:0", "text_tokens": 16, "prediction": "velocity"}


@pytest.fixture(scope="module")
def source(serving_folder):
    sd, cfg = read_checkpoint(serving_folder / "transformer")
    return sd, cfg


@pytest.fixture(scope="module")
def files(source, tmp_path_factory):
    sd, cfg = source
    root = tmp_path_factory.mktemp("gguf")
    return {q: save_gguf(sd, root / f"tiny-{q}.gguf", q, cfg, RECORD) for q in ("Q8_0", "Q4_1")}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def test_the_layout_keeps_small_and_modulation_tensors_in_f32(source, files):
    sd, _ = source
    types = gguf_tensor_types(files["Q8_0"])
    assert set(types) == set(sd)  # the released names, no prefix
    for key, kind in types.items():
        value = sd[key]
        if value.ndim == 1 or value.numel() <= 1024 or "mod.lin" in key or key.startswith("tmlp."):
            assert kind == "F32", (key, kind)
    assert types[BIG] == "Q8_0" and types["blocks.0.attn.wq.weight"] == "F32"  # 32 x 32
    assert gguf_tensor_types(files["Q4_1"])["blocks.0.mlp.up.weight"] == "Q4_1"


def test_a_gguf_reads_back_dequantized_with_its_config_and_record(source, files):
    sd, cfg = source
    back, conf, record = read_gguf(files["Q8_0"])
    assert conf is not None and conf["width"] == cfg.width
    assert record == check_conditioning(RECORD)
    types = gguf_tensor_types(files["Q8_0"])
    for key, value in sd.items():
        assert back[key].shape == value.shape and back[key].dtype == torch.float32
        if types[key] == "F32":
            assert torch.equal(back[key], value.float()), key
    q8 = rel_err(back[BIG], sd[BIG])
    q4 = rel_err(read_gguf(files["Q4_1"])[0][BIG], sd[BIG])
    assert 0 < q8 < 0.01 < q4 < 0.15, (q8, q4)
    loaded, loaded_cfg = read_checkpoint(files["Q8_0"])  # the generic reader takes .gguf
    assert loaded_cfg == cfg and torch.equal(loaded[BIG], back[BIG])
    assert read_conditioning(files["Q8_0"]) == check_conditioning(RECORD)


def test_convert_writes_a_gguf_that_samples_close_to_its_source(serving_folder, tmp_path):
    runner = CliRunner()
    out = tmp_path / "tiny-Q8_0.gguf"
    res = runner.invoke(app, ["convert", "--to", "gguf", "--qtype", "Q8_0",
                              str(serving_folder / "transformer"), str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert gguf_tensor_types(out)[BIG] == "Q8_0"

    def sample(name: str, *weights: str) -> np.ndarray:
        args = ["sample", "--model", str(serving_folder), "--prompt", "a red circle",
                "--size", "32x32", "--steps", "4", "--cfg", "2", "--text-tokens", "16",
                "--device", "cpu", "--out", str(tmp_path / name), *weights]  # fmt: skip
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        return np.asarray(Image.open(next((tmp_path / name).glob("*.png")))).astype(int)

    full, quant = sample("full"), sample("gguf", "--weights", str(out))
    assert 0 < np.abs(full - quant).mean() < 3.0  # of 255 levels


def test_bad_gguf_files_and_types_are_clear_errors(source, files, tmp_path):
    sd, cfg = source
    with pytest.raises(UserError, match="choose one of Q8_0"):
        save_gguf(sd, tmp_path / "x.gguf", "Q3_K", cfg)
    torn = tmp_path / "torn.gguf"
    torn.write_bytes(files["Q8_0"].read_bytes()[:200])
    with pytest.raises(UserError, match="cannot read GGUF file"):
        read_gguf(torn)
    with pytest.raises(UserError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.gguf")
    import gguf

    other = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(path=None, arch="llama")
    writer.add_tensor("w", np.ones((2, 2), np.float32))
    writer.write_header_to_file(path=other)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UserError, match="architecture 'llama', not 'krea2'"):
        read_gguf(other)
