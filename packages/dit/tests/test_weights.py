"""Weights: released and diffusers formats, converters, from_pretrained, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import Krea2Transformer2DModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from krea2.dit.config import get_config
from krea2.dit.keymap import diffusers_to_krea, krea_to_diffusers
from krea2.dit.model import Krea2DiT
from krea2.dit.testing import make_inputs, randomize
from krea2.dit.weights import (
    CONDITIONING_KEY,
    CheckpointError,
    check_conditioning,
    convert,
    from_pretrained,
    infer_config,
    load_weights,
    read_checkpoint,
    read_conditioning,
    save_weights,
)
from krea2.infra.errors import UserError


@pytest.fixture
def model(tiny_cfg):
    m = Krea2DiT(tiny_cfg).eval()
    randomize(m, seed=3)
    return m


def out(m, cfg):
    img, txt, t, pos, mask = make_inputs(cfg)
    with torch.no_grad():
        return m(img, txt, t, pos, mask)


def test_key_maps_round_trip_bit_exactly(model):
    sd = model.state_dict()
    back = diffusers_to_krea(krea_to_diffusers(sd))
    assert list(back) == list(sd)
    for k in sd:
        assert torch.equal(back[k], sd[k]) and back[k].dtype == sd[k].dtype


def test_krea_file_round_trip_with_config_metadata(model, tiny_cfg, tmp_path):
    path = save_weights(model, tmp_path / "m.safetensors")
    loaded = from_pretrained(path)
    assert loaded.cfg == tiny_cfg
    torch.testing.assert_close(out(loaded, tiny_cfg), out(model, tiny_cfg), rtol=0, atol=0)


def test_prefixed_released_file_loads(model, tiny_cfg, tmp_path):
    for prefix in ("diffusion_model.", "model.diffusion_model."):
        sd = {prefix + k: v for k, v in model.state_dict().items()}
        save_file(sd, tmp_path / "p.safetensors")  # no config metadata: inferred from shapes
        loaded = from_pretrained(tmp_path / "p.safetensors", config=tiny_cfg)
        torch.testing.assert_close(out(loaded, tiny_cfg), out(model, tiny_cfg), rtol=0, atol=0)


def test_infer_config_from_shapes():
    cfg = get_config("toy", depth=3, patch=2, latent_channels=12)
    with torch.device("meta"):
        sd = Krea2DiT(cfg).state_dict()
    got = infer_config(sd)
    for f in ("width", "depth", "heads", "kv_heads", "text_taps", "text_heads", "in_channels"):
        assert getattr(got, f) == getattr(cfg, f), f
    with torch.device("meta"):
        big = infer_config(Krea2DiT.from_config("krea2-12b").state_dict())
    assert big.replace(name="x") == get_config("krea2-12b").replace(name="x")


def test_diffusers_export_loads_with_diffusers_and_matches(model, tiny_cfg, tmp_path):
    folder = save_weights(model, tmp_path / "d", format="diffusers")
    ref = Krea2Transformer2DModel.from_pretrained(folder).eval()
    img, txt, t, pos, mask = make_inputs(tiny_cfg)
    with torch.no_grad():
        want = ref(img, txt, t, pos, encoder_attention_mask=mask, return_dict=False)[0]
    got = out(model, tiny_cfg)
    assert ((got - want).abs().max() / want.abs().max()) <= 1e-5
    # ... and reads back into ours bit-exactly.
    torch.testing.assert_close(out(from_pretrained(folder), tiny_cfg), got, rtol=0, atol=0)


def test_convert_both_ways_bit_exact(model, tmp_path):
    src = save_weights(model, tmp_path / "m.safetensors")
    d = convert(src, tmp_path / "d", to="diffusers")
    back = convert(d, tmp_path / "back.safetensors", to="krea")
    a, b = load_file(src), load_file(back)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    dsd = load_file(d / "diffusion_pytorch_model.safetensors")
    assert dsd["transformer_blocks.0.scale_shift_table"].shape == (6, 32)
    assert json.loads((d / "config.json").read_text())["_class_name"] == "Krea2Transformer2DModel"


def test_missing_and_unexpected_keys_are_named(model, tiny_cfg):
    sd = dict(model.state_dict())
    del sd["blocks.1.attn.wk.weight"]
    sd["blocks.9.extra"] = torch.zeros(1)
    fresh = Krea2DiT(tiny_cfg)
    with pytest.raises(
        CheckpointError, match=r"1 missing \(first: 'blocks.1.attn.wk.weight'\)"
    ) as e:
        load_weights(fresh, sd)
    assert "1 unexpected (first: 'blocks.9.extra')" in str(e.value)


def test_shape_mismatch_is_named(model):
    other = Krea2DiT(get_config("tiny", kv_heads=1))
    with pytest.raises(CheckpointError, match=r"'blocks.0.attn.wk.weight' has shape \(16, 32\)"):
        load_weights(other, model.state_dict())


def test_dtype_mismatch_under_assign_is_named(model, tiny_cfg):
    sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    with torch.device("meta"):
        target = Krea2DiT(tiny_cfg)
    with pytest.raises(
        CheckpointError, match=r"is torch.bfloat16 but the model expects torch.float32"
    ):
        load_weights(target, sd, assign=True)
    load_weights(target, sd, assign=True, dtype=torch.float32)  # explicit cast is fine
    assert target.first.weight.dtype == torch.float32


def test_bf16_checkpoint_loads_as_bf16(model, tiny_cfg, tmp_path):
    sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    save_weights(sd, tmp_path / "b.safetensors", config=tiny_cfg)
    loaded = from_pretrained(tmp_path / "b.safetensors")
    assert loaded.first.weight.dtype == torch.bfloat16


def test_unreadable_and_missing_files(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        read_checkpoint(bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(UserError, match="cannot tell the checkpoint format"):
        save_file({"foo.weight": torch.zeros(2)}, tmp_path / "odd.safetensors")
        read_checkpoint(tmp_path / "odd.safetensors")


def test_ablation_config_cannot_go_to_diffusers(tmp_path):
    m = Krea2DiT(get_config("tiny", attn_gate=False))
    with pytest.raises(UserError, match="cannot represent"):
        save_weights(m, tmp_path / "d", format="diffusers")


def test_conditioning_record_round_trips_in_both_formats(model, tmp_path):
    record = {"text_encoder": "trainer:words", "prediction": "x0", "shift": 1, "x0_min_t": 0.1}
    want = {**record, "shift": 1.0, "text_tokens": None, "autoencoder": None}
    krea = save_weights(model, tmp_path / "c.safetensors", conditioning=record)
    diff = save_weights(model, tmp_path / "d", format="diffusers", conditioning=record)
    assert read_conditioning(krea) == want
    assert read_conditioning(diff) == want
    raw = safe_open(str(krea), "pt").metadata()[CONDITIONING_KEY]
    assert json.loads(raw) == want
    from_pretrained(krea)  # the record does not disturb loading


def test_weights_without_a_record_have_no_conditioning(model, tmp_path):
    assert read_conditioning(save_weights(model, tmp_path / "plain.safetensors")) is None
    assert read_conditioning(save_weights(model, tmp_path / "d", format="diffusers")) is None


def test_conditioning_defaults_and_bad_records():
    got = check_conditioning({"text_encoder": "tiny:0"})
    assert got == {"text_encoder": "tiny:0", "prediction": "velocity", "shift": None,
                   "text_tokens": None, "autoencoder": None}  # fmt: skip
    for bad, field in [({}, "text_encoder"), ({"text_encoder": "tiny", "shift": "x"}, "shift"),
                       ({"text_encoder": "tiny", "prediction": 3}, "prediction"),
                       ({"text_encoder": "tiny", "text_tokens": 1.5}, "text_tokens"),
                       ({"text_encoder": "tiny", "autoencoder": 3}, "autoencoder")]:  # fmt: skip
        with pytest.raises(UserError, match=field):
            check_conditioning(bad)


def test_malformed_diffusers_config_names_the_file(model, tmp_path):
    folder = save_weights(model, tmp_path / "d", format="diffusers")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json is not valid JSON"):
        read_checkpoint(folder)


def test_convert_keeps_the_conditioning_record(model, tmp_path):
    record = {"text_encoder": "trainer:words", "prediction": "x0", "shift": 0.5}
    src = save_weights(model, tmp_path / "run.safetensors", conditioning=record)
    folder = convert(src, tmp_path / "d", to="diffusers")
    back = convert(folder, tmp_path / "back.safetensors", to="krea")
    assert read_conditioning(folder) == read_conditioning(back) == read_conditioning(src)


def test_a_training_checkpoint_folder_is_not_weights(tmp_path):
    step = tmp_path / "runs" / "toy" / "checkpoints" / "sft" / "step-000000049"
    step.mkdir(parents=True)
    (step / "__0_0.distcp").write_bytes(b"")
    for read in (from_pretrained, read_conditioning):
        with pytest.raises(CheckpointError, match="training checkpoint") as e:
            read(step)
        assert f"krea2 train pma {tmp_path / 'runs' / 'toy'} --stage sft" in str(e.value)
