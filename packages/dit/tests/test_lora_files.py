"""LoRA adapter files at sampling time (krea2.dit.lora_files): every layout `krea2 train
export` writes reads as the same adapter, applying one equals merging it into the weights,
the base comes back bit for bit, and `krea2 dit serve --lora` applies adapters by name."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from krea2.dit.image_requests import RequestLimits
from krea2.dit.image_server import ImageServerConfig, ImageServerThread
from krea2.dit.keymap import krea_to_diffusers
from krea2.dit.lora_files import applied, load_lora, named_lora_files, parse_lora_spec
from krea2.dit.served_model import ServedModel
from krea2.infra.errors import UserError

RANK, ALPHA = 4, 8.0  # alpha / rank = 2: a file that loses alpha shows up as a factor of 2


def adapted_linears(net: torch.nn.Module) -> list[str]:
    """A few of the block Linears (released names), the modules a LoRA stage adapts."""
    names = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Linear)]
    return [n for n in names if n.startswith("blocks.") and ".attn.w" in n][:4]


def random_adapter(net: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in adapted_linears(net):
        w = net.get_submodule(name).weight
        out[f"{name}.lora_A.weight"] = torch.randn(RANK, w.shape[1], generator=g) * 0.3
        out[f"{name}.lora_B.weight"] = torch.randn(w.shape[0], RANK, generator=g) * 0.3
    return out


def write_layouts(adapter: dict[str, torch.Tensor], root) -> dict[str, object]:
    """The adapter in the three layouts: bare released names with our metadata, ComfyUI's
    (prefix + per-module .alpha) and a diffusers folder (diffusers names + peft metadata)."""
    root.mkdir(parents=True, exist_ok=True)
    bare = root / "bare.safetensors"
    save_file(
        adapter, str(bare), metadata={"krea2.lora": json.dumps({"rank": RANK, "alpha": ALPHA})}
    )
    comfy = root / "comfy.safetensors"
    state = {f"diffusion_model.{k}": v for k, v in adapter.items()}
    for k in adapter:
        if ".lora_A." in k:
            state[f"diffusion_model.{k.split('.lora_A.')[0]}.alpha"] = torch.tensor(ALPHA)
    save_file(state, str(comfy))
    folder = root / "diffusers-lora"
    folder.mkdir()
    meta = {"lora_adapter_metadata": json.dumps({"transformer.r": RANK,
                                                 "transformer.lora_alpha": ALPHA})}  # fmt: skip
    diffusers = {f"transformer.{k}": v for k, v in krea_to_diffusers(adapter).items()}
    save_file(diffusers, str(folder / "pytorch_lora_weights.safetensors"), metadata=meta)
    return {"bare": bare, "comfy": comfy, "diffusers": folder}


@pytest.fixture(scope="module")
def model(serving_folder):
    return ServedModel.load(serving_folder, text_tokens=16)


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    return write_layouts(random_adapter(model.net), tmp_path_factory.mktemp("lora"))


def forward(net: torch.nn.Module) -> torch.Tensor:
    name = adapted_linears(net)[0]
    layer = net.get_submodule(name)
    x = torch.randn(3, layer.weight.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return layer(x)


def test_every_layout_reads_as_the_same_adapter_with_its_alpha(model, files):
    loaded = {kind: load_lora(path) for kind, path in files.items()}
    bare = loaded["bare"]
    assert bare.rank == RANK and len(bare.modules) == 4
    assert loaded["diffusers"].name == "diffusers-lora"
    for adapter in loaded.values():
        assert sorted(adapter.modules) == sorted(bare.modules)
        for module, (a, b, scale) in adapter.modules.items():
            assert scale == ALPHA / RANK
            torch.testing.assert_close(a, bare.modules[module][0], rtol=0, atol=0)
            torch.testing.assert_close(b, bare.modules[module][1], rtol=0, atol=0)
        adapter.check_fits(model.net)


def test_applying_equals_merging_and_the_base_comes_back_bit_for_bit(model, files):
    net, adapter = model.net, load_lora(files["comfy"])
    name = adapted_linears(net)[0]
    a, b, s = adapter.modules[name]
    before = forward(net)
    with applied(net, [(adapter, 0.5)]):
        hooked = forward(net)
    layer = net.get_submodule(name)
    x = torch.randn(3, layer.weight.shape[1], generator=torch.Generator().manual_seed(1))
    merged = torch.nn.functional.linear(x, layer.weight + 0.5 * s * (b @ a), layer.bias)
    torch.testing.assert_close(hooked, merged, rtol=1e-5, atol=1e-5)
    assert not torch.equal(hooked, before)
    assert torch.equal(forward(net), before)  # hooks gone, weights never touched
    with applied(net, [(adapter, 0.0)]):  # scale 0 is the base exactly
        assert torch.equal(forward(net), before)
    with applied(net, [(adapter, 0.25), (adapter, 0.25)]):  # stacked scales add
        torch.testing.assert_close(forward(net), hooked, rtol=1e-5, atol=1e-5)


def test_an_adapter_for_another_model_or_a_torn_file_is_a_clear_error(model, files, tmp_path):
    adapter = random_adapter(model.net)
    key = next(iter(adapter))
    wrong = dict(adapter, **{key: torch.zeros(RANK, 7)})
    save_file(wrong, str(tmp_path / "shape.safetensors"))
    with pytest.raises(UserError, match="another model shape"):
        load_lora(tmp_path / "shape.safetensors").check_fits(model.net)
    save_file({"blocks.99.attn.wq.lora_A.weight": torch.zeros(2, 4),
               "blocks.99.attn.wq.lora_B.weight": torch.zeros(4, 2)},
              str(tmp_path / "other.safetensors"))  # fmt: skip
    with pytest.raises(UserError, match="which this model lacks"):
        load_lora(tmp_path / "other.safetensors").check_fits(model.net)
    save_file({key: adapter[key]}, str(tmp_path / "half.safetensors"))
    with pytest.raises(UserError, match="has no lora_B"):
        load_lora(tmp_path / "half.safetensors")
    save_file({"blocks.0.attn.wq.weight": torch.zeros(2, 2)}, str(tmp_path / "w.safetensors"))
    with pytest.raises(UserError, match="holds no LoRA tensors"):
        load_lora(tmp_path / "w.safetensors")
    torn = tmp_path / "torn.safetensors"
    torn.write_bytes(files["bare"].read_bytes()[:100])
    with pytest.raises(UserError, match="cannot read LoRA file"):
        load_lora(torn)
    with pytest.raises(UserError, match="does not exist"):
        load_lora(tmp_path / "missing.safetensors")


def test_lora_flags_parse_with_clear_errors():
    assert parse_lora_spec("a.safetensors") == (None, Path("a.safetensors"), 1.0)
    assert parse_lora_spec("a.safetensors:-0.5") == (None, Path("a.safetensors"), -0.5)
    assert parse_lora_spec("c:/x/a.safetensors")[1] == Path("c:/x/a.safetensors")  # ':' in a path
    assert parse_lora_spec("m=x.safetensors", named=True) == ("m", Path("x.safetensors"), 1.0)
    for bad, named in (("x.safetensors", True), ("=x", True), (":0.5", False), ("a:nan", False)):
        with pytest.raises(UserError, match="--lora"):
            parse_lora_spec(bad, named=named)
    with pytest.raises(UserError, match="given twice"):
        named_lora_files([f"a={__file__}", f"a={__file__}"])
    with pytest.raises(UserError, match="does not exist"):
        named_lora_files(["a=missing.safetensors"])


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/images/generations", json=body, timeout=120)


def image(r: httpx.Response) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(r.json()["data"][0]["b64_json"]))))


def test_the_server_applies_adapters_by_name_and_refuses_unknown_ones(serving_folder, files):
    served = ServedModel.load(serving_folder, text_tokens=16,
                              loras={"bare": files["bare"], "comfy": files["comfy"]})  # fmt: skip
    config = ImageServerConfig(default_size="32x32", limits=RequestLimits(max_steps=4))
    with ImageServerThread(served, config=config) as srv:
        base = {"prompt": "a red circle", "steps": 2, "seed": 3}
        plain = image(post(srv.url, base))
        styled = post(srv.url, base | {"loras": [{"name": "bare", "scale": 1.0}]})
        assert styled.status_code == 200, styled.text
        assert not np.array_equal(image(styled), plain)
        # the same adapter in another layout gives the same image; scale 0 is no adapter
        same = image(post(srv.url, base | {"loras": [{"name": "comfy"}]}))
        assert np.abs(same.astype(int) - image(styled).astype(int)).max() <= 1
        off = post(srv.url, base | {"loras": [{"name": "bare", "scale": 0}]})
        assert np.array_equal(image(off), plain)
        assert np.array_equal(image(post(srv.url, base)), plain)  # the base is untouched
        for loras, says in (
            ([{"name": "teal"}], "'teal' is not loaded here; loaded: bare, comfy"),
            ([{"name": "bare"}, {"name": "bare"}], "named twice"),
            ([{"name": "bare", "scale": 100}], "scale: Input should be less than or equal to 8"),
            ([{"name": "bare", "weight": 1}], "weight: unknown field"),
        ):
            r = post(srv.url, base | {"loras": loras})
            assert r.status_code == 400, r.text
            assert says in r.json()["error"]["message"]


def test_a_server_without_adapters_says_how_to_load_one(model):
    config = ImageServerConfig(default_size="32x32", limits=RequestLimits(max_steps=4))
    with ImageServerThread(model, config=config) as srv:
        r = post(srv.url, {"prompt": "x", "steps": 1, "loras": [{"name": "a"}]})
    assert r.status_code == 400 and "--lora NAME=PATH" in r.json()["error"]["message"]


def test_sample_applies_a_lora_file_at_its_scale(serving_folder, files, tmp_path):
    from typer.testing import CliRunner

    from krea2.dit.cli import app

    def run(out: str, *extra: str) -> np.ndarray:
        args = ["sample", "--model", str(serving_folder), "--prompt", "a red circle",
                "--size", "32x32", "--steps", "2", "--text-tokens", "16", "--device", "cpu",
                "--out", str(tmp_path / out), *extra]  # fmt: skip
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        return np.asarray(Image.open(next((tmp_path / out).glob("*.png"))))

    plain = run("plain")
    assert not np.array_equal(run("lora", "--lora", f"{files['diffusers']}:1.0"), plain)
    assert np.array_equal(run("off", "--lora", f"{files['bare']}:0"), plain)
    missing = ["--lora", str(tmp_path / "no.safetensors")]
    args = ["sample", "--model", str(serving_folder), "--prompt", "x", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, [*args, *missing])  # the krea2 host prints it in one line
    assert isinstance(res.exception, UserError) and "does not exist" in str(res.exception)
