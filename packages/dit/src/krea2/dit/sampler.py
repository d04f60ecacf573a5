"""Euler flow sampler with Krea's CFG and per-image seeds (a function, no scheduler class)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from krea2.dit.flow import guided_velocity

VelocityFn = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]


def seeded_noise(
    seeds: Sequence[int],
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Tensor:
    """[len(seeds), *shape] standard normal; image i uses Generator(device).manual_seed(seeds[i]).

    So an image does not depend on which other images share its batch.
    """
    out = []
    for s in seeds:
        g = torch.Generator(device=device).manual_seed(int(s))
        out.append(torch.randn(tuple(shape), generator=g, dtype=dtype, device=device))
    return torch.stack(out)


@torch.no_grad()
def euler_sample(
    velocity: VelocityFn,
    noise: Tensor,
    times: Tensor,
    txt: Tensor,
    txt_mask: Tensor | None = None,
    cfg: float = 0.0,
    neg_txt: Tensor | None = None,
    neg_mask: Tensor | None = None,
    on_step: Callable[[int, Tensor], None] | None = None,
) -> Tensor:
    """Integrate x <- x + (t_next - t) v from times[0] (= 1, noise) to times[-1] (= 0).

    velocity(x, txt, t [B], txt_mask) -> v, e.g. `Krea2DiT.velocity` on latents [B, C, H, W].
    With cfg != 0 the negative (`neg_txt`, default: required) runs in the same batch as the
    positive and v = v_c + cfg (v_c - v_u). The state is kept in fp32 between steps.
    """
    if cfg != 0 and neg_txt is None:
        raise ValueError("cfg != 0 needs neg_txt (the empty-prompt embedding)")
    x = noise.float()
    b = x.shape[0]
    times = times.to(torch.float64)
    if cfg != 0:
        txt2 = torch.cat([txt, neg_txt.expand_as(txt) if neg_txt.shape[0] == 1 else neg_txt])
        if txt_mask is None and neg_mask is None:
            mask2 = None
        else:
            pm = txt_mask if txt_mask is not None else txt.new_ones(txt.shape[:2], dtype=torch.bool)
            nm = neg_mask if neg_mask is not None else pm.new_ones(neg_txt.shape[:2])
            mask2 = torch.cat([pm, nm.expand_as(pm) if nm.shape[0] == 1 else nm])
    for i in range(len(times) - 1):
        t_cur, t_next = float(times[i]), float(times[i + 1])
        tb = torch.full((b,), t_cur, device=x.device)
        xin = x.to(noise.dtype)
        if cfg != 0:
            v2 = velocity(torch.cat([xin, xin]), txt2, torch.cat([tb, tb]), mask2).float()
            v = guided_velocity(v2[:b], v2[b:], cfg)
        else:
            v = velocity(xin, txt, tb, txt_mask).float()
        x = x + (t_next - t_cur) * v
        if on_step is not None:
            on_step(i, x)
    return x.to(noise.dtype)
