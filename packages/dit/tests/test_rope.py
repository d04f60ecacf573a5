"""The custom-autograd RoPE rotation equals the composite formula, forward and backward."""

from __future__ import annotations

import torch

from krea2.dit.rope import _Rotate, apply_rope, rope_angles


def _reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = 2 * cos.shape[-1]
    pairs = x[..., :r].unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)
    return torch.cat([out, x[..., r:]], dim=-1)


def test_rotation_matches_composite_with_partial_rope():
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 20, (2, 9, 3), generator=g)
    for axes in ((8, 12, 12), (4, 6, 6)):  # full and partial rotation of head_dim 32
        cos, sin = rope_angles(pos, axes, 1000.0)
        x = torch.randn(2, 9, 3, 32, generator=g, requires_grad=True)
        grad = torch.randn(2, 9, 3, 32, generator=g)
        out = apply_rope(x, cos, sin)
        (gx,) = torch.autograd.grad(out, x, grad)
        ref = _reference(x, cos, sin)
        (gr,) = torch.autograd.grad(ref, x, grad)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
        torch.testing.assert_close(gx, gr, rtol=0, atol=1e-6)


def test_rotation_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    cos, sin = rope_angles(torch.randint(0, 9, (1, 5, 3), generator=g), (4, 4, 4), 100.0)
    x = torch.randn(1, 5, 2, 12, dtype=torch.float64, generator=g, requires_grad=True)
    c, s = cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)
    assert torch.autograd.gradcheck(lambda t: _Rotate.apply(t, c, s), (x,))
