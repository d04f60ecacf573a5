"""The style module's spatial path: tile-pooled tokens and the decoupled attention."""

from __future__ import annotations

import pytest
import torch

from krea2.dit.config import get_config
from krea2.dit.model import Krea2DiT
from krea2.dit.style_cross import cross_flops, sincos_at, tile_pool
from krea2.dit.style_module import (
    StyleConfig,
    StyleModule,
    load_style_module,
    save_style_module,
    sincos_2d,
    style_module_flops,
    style_module_params,
)
from krea2.dit.testing import count_flops, make_inputs, randomize
from krea2.infra.errors import UserError


@pytest.fixture(scope="module")
def dit():
    model = Krea2DiT(get_config("tiny")).eval()
    randomize(model, seed=0, std=0.1)
    return model


def spatial(seed=1, **overrides):
    cfg = StyleConfig.for_dit(get_config("tiny"), pool="tiles", cross=2, **overrides)
    module = StyleModule(cfg).eval()
    randomize(module, seed=seed, std=0.1)  # the output projections too: the path is live
    return module


def refs(batch=2, count=2, seed=2):
    """Reference latents [B, R, C=4, 6, 10] for the tiny config (patch 2)."""
    return torch.randn(batch, count, 4, 6, 10, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def run(dit, tokens=None):
    img, txt, t, pos, mask = make_inputs(dit.cfg)
    return dit(img, txt, t, pos, mask, style=tokens)


def test_tile_tokens_are_tile_means_with_their_centres_code():
    x = torch.arange(2 * 12 * 8, dtype=torch.float32).reshape(2, 12, 8)  # a 3 x 4 grid
    out = tile_pool(x, 3, 4, tokens=4)  # 2 x 2 tiles of a 3 x 4 grid
    grid = x.unflatten(1, (3, 4))
    first = grid[:, :2, :2].mean(dim=(1, 2))  # adaptive pooling: rows 0-1, columns 0-1
    code = sincos_at(torch.tensor([[0.25, 0.5]]), 8)[0]  # centres (0.75 - 0.5, 1 - 0.5)
    torch.testing.assert_close(out[:, 0], first + code)
    assert out.shape == (2, 4, 8)


def test_the_patch_code_is_the_position_code_of_every_patch():
    ii, jj = torch.meshgrid(torch.arange(3), torch.arange(5), indexing="ij")
    want = sincos_at(torch.stack([ii, jj], -1).reshape(-1, 2), 16)
    assert torch.equal(sincos_2d(3, 5, 16, "cpu"), want)


def test_an_untrained_path_adds_nothing(dit):
    module = StyleModule(StyleConfig.for_dit(get_config("tiny"), pool="tiles", cross=2)).eval()
    tokens = module(refs(), torch.ones(2, 2))
    assert tokens.cross is not None
    plain = tokens._replace(cross=None)
    assert torch.equal(run(dit, tokens), run(dit, plain))


def test_the_path_changes_the_output_and_strength_zero_removes_it_exactly(dit):
    module = spatial()
    with torch.no_grad():
        live = run(dit, module(refs(), torch.ones(2, 2)))
        off = module(refs(), torch.zeros(2, 2))
        half = run(dit, module(refs(), torch.tensor([[1.0, 0.0], [1.0, 0.0]])))
        alone = run(dit, module(refs()[:, :1], torch.ones(2, 1)))
    assert off is None  # the DiT's path without references, unchanged
    assert not torch.allclose(live, run(dit))
    # strength 0 on reference 2 is the output of reference 1 alone (same slot 0)
    torch.testing.assert_close(half, alone)


def test_a_reference_weighs_more_against_the_sink_as_its_strength_grows(dit):
    module = spatial()
    base = run(dit)
    moved = []
    for s in (0.01, 0.3, 1.0, 3.0):
        out = run(dit, module(refs(count=1), torch.full((2, 1), s)))
        moved.append(float((out - base).norm()))
    assert moved == sorted(moved)


def test_gradients_reach_the_path_through_a_frozen_dit(dit):
    module = spatial().train()
    dit.requires_grad_(False)
    img, txt, t, pos, mask = make_inputs(dit.cfg)
    out = dit(img, txt, t, pos, mask, style=module(refs(), torch.ones(2, 2)))
    out.square().mean().backward()
    for i, layer in enumerate(module.cross):
        assert layer.wo.weight.grad is not None and layer.wo.weight.grad.abs().sum() > 0, i
    dit.requires_grad_(True)


def test_the_config_refuses_a_bad_pool_a_non_square_grid_and_a_negative_cross():
    with pytest.raises(UserError, match="pool='grid'"):
        StyleConfig.for_dit(get_config("tiny"), pool="grid")
    with pytest.raises(UserError, match="tokens=8 must be a square"):
        StyleConfig.for_dit(get_config("tiny"), pool="tiles", tokens=8)
    with pytest.raises(UserError, match="cross=-1"):
        StyleConfig.for_dit(get_config("tiny"), cross=-1)


def test_a_spatial_path_deeper_than_the_dit_is_refused_where_the_module_meets_it():
    tiny = get_config("tiny")  # 2 blocks
    StyleConfig.for_dit(tiny, pool="tiles", cross=2).check_matches(tiny)
    with pytest.raises(UserError, match="has cross 3 but the DiT 'tiny' has only 2 blocks"):
        StyleConfig.for_dit(tiny, pool="tiles", cross=3).check_matches(tiny)


def test_parameter_and_flop_counts_match_torch(dit):
    module = spatial(tokens=9)
    assert sum(p.numel() for p in module.parameters()) == style_module_params(module.cfg)
    assert not hasattr(module, "queries")  # no attention pooling with tiles
    counted = count_flops(lambda: module(refs(batch=1, count=2), torch.ones(1, 2)))
    assert counted == style_module_flops(module.cfg, ref_tokens=15, refs=2)
    layer = module.cross[0]
    rows, code = torch.randn(1, 15, 32), torch.randn(15, 32)
    counted = count_flops(lambda: layer(rows, code, torch.randn(1, 9, 32), torch.zeros(1, 9)))
    assert counted == cross_flops(32, 1, image_tokens=15, style_tokens=9)


def test_a_saved_spatial_module_loads_with_its_path(dit, tmp_path):
    module = spatial()
    path = save_style_module(module, tmp_path / "style.safetensors")
    loaded = load_style_module(path, get_config("tiny"))
    assert (loaded.cfg.pool, loaded.cfg.cross) == ("tiles", 2)
    with torch.no_grad():
        want = run(dit, module(refs(), torch.ones(2, 2)))
        assert torch.equal(run(dit, loaded(refs(), torch.ones(2, 2))), want)


def test_the_image_rows_code_is_in_patches_under_position_interpolation(monkeypatch):
    """With rope_ref_grid the image rows' RoPE positions are scaled; their code is not, so
    a row and the reference tile above it keep one code."""
    from dataclasses import replace

    import krea2.dit.model as model_module
    from krea2.dit.patches import image_positions

    seen = []

    def spy(ij, dim):
        seen.append(ij.clone())
        return sincos_at(ij, dim)

    monkeypatch.setattr(model_module, "sincos_at", spy)
    cfg = replace(get_config("tiny"), rope_ref_grid=2)
    model = Krea2DiT(cfg).eval()
    img, txt, t, _, mask = make_inputs(cfg)  # a 3 x 5 grid
    pos = image_positions(txt.shape[1], 3, 5, ref_grid=2)
    with torch.no_grad():
        model(img, txt, t, pos, mask, style=spatial()(refs(), torch.ones(2, 2)))
    ii, jj = torch.meshgrid(torch.arange(3), torch.arange(5), indexing="ij")
    want = torch.stack([ii, jj], -1).reshape(-1, 2).float()
    torch.testing.assert_close(seen[0], want)
