"""Flow sampling on a velocity function: the `velocity(x, t)` contract, CFG as a wrapper, Euler.

A velocity function is the whole interface between a sampler and a model: callers bind
the model and its conditioning (text states, captions, ...) into a closure, so samplers,
CFG and RL rollouts step through time without knowing what conditions the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from krea2.dit.flow import guided_velocity
from krea2.dit.model import Krea2DiT
from krea2.dit.style_module import StyleTokens
from krea2.infra.errors import UserError

Velocity = Callable[[Tensor, Tensor], Tensor]
"""velocity(x, t) -> v. x [B, C, H, W] latents at flow time t [B] (float32 in [0, 1],
1 = noise); v [B, C, H, W] estimates noise - data (docs/architecture.md, contract 5)."""


def dit_velocity(
    model: Krea2DiT,
    txt: Tensor,
    txt_mask: Tensor | None = None,
    pack_text: bool = False,
    style: StyleTokens | None = None,
    style_times: tuple[float, float] | None = None,
) -> Velocity:
    """`model` conditioned on txt [B, T, taps, dim] (mask [B, T] bool, True = valid token).

    `pack_text` drops padded text tokens before the blocks (eager inference; see
    `Krea2DiT.forward`). `style`: StyleTokens for the same B rows (None: no reference).
    `style_times` (lo, hi): the style acts only on rows whose flow time t has
    lo <= t <= hi; the others take the exact path without it (None: every t). IP-Adapter's
    start/end: objects and colours are laid out in the first steps, fine texture in the
    last (docs/design/demo.md, "Where the spatial path's content cost comes from").
    """

    def plain(x: Tensor, t: Tensor) -> Tensor:
        return model.velocity(x, txt, t, txt_mask, pack_text=pack_text)

    def styled(x: Tensor, t: Tensor) -> Tensor:
        return model.velocity(x, txt, t, txt_mask, pack_text=pack_text, style=style)

    if style is None:
        return plain
    return styled if style_times is None else timed_style(styled, plain, style_times)


def check_style_times(times: tuple[float, float]) -> tuple[float, float]:
    """(lo, hi) flow times with 0 <= lo <= hi <= 1 (1 = noise), as floats; UserError else."""
    try:
        lo, hi = (float(v) for v in times)
    except (TypeError, ValueError):
        raise UserError(f"style times {times!r} must be two numbers LO:HI") from None
    if not (0.0 <= lo <= hi <= 1.0):  # also refuses nan
        raise UserError(
            f"style times {lo:g}:{hi:g} must be flow times with 0 <= LO <= HI <= 1 (1 = noise; "
            "0:0.8 = the last steps only)"
        )
    return lo, hi


def timed_style(styled: Velocity, plain: Velocity, times: tuple[float, float]) -> Velocity:
    """`styled` on the rows whose flow time t [B] has lo <= t <= hi (`times` = (lo, hi)),
    `plain` (the same model without the references) on the others. An Euler step puts every
    row at one t, so a step calls one of the two; rows at different times call both.
    UserError for times that are not 0 <= lo <= hi <= 1 (:func:`check_style_times`)."""
    lo, hi = check_style_times(times)

    def velocity(x: Tensor, t: Tensor) -> Tensor:
        on = (t >= lo) & (t <= hi)  # [B]
        if bool(on.all()):
            return styled(x, t)
        if not bool(on.any()):
            return plain(x, t)
        return torch.where(on.view(-1, *[1] * (x.dim() - 1)), styled(x, t), plain(x, t))

    return velocity


def from_x0(predict_x0: Velocity, min_t: float = 0.05) -> Velocity:
    """The velocity of a model that predicts clean data: x0 = predict_x0(x, t) [B, C, H, W]
    gives v = (x - x0) / max(t, min_t) (x0 = x - t v; the floor keeps t -> 0 finite)."""

    def velocity(x: Tensor, t: Tensor) -> Tensor:
        tt = t.to(x.dtype).clamp_min(min_t).view(-1, *[1] * (x.dim() - 1))
        return (x - predict_x0(x, t)) / tt

    return velocity


def with_negative(
    txt: Tensor, mask: Tensor | None, neg_txt: Tensor, neg_mask: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The doubled text batch of `with_cfg`: rows [txt; neg_txt] ([B or 1, T, ...] negatives
    are broadcast to B rows), masks likewise (None when neither side has one)."""
    txt2 = torch.cat([txt, neg_txt.expand_as(txt) if neg_txt.shape[0] == 1 else neg_txt])
    if mask is None and neg_mask is None:
        return txt2, None
    pm = mask if mask is not None else txt.new_ones(txt.shape[:2], dtype=torch.bool)
    nm = neg_mask if neg_mask is not None else pm.new_ones(neg_txt.shape[:2])
    return txt2, torch.cat([pm, nm.expand_as(pm) if nm.shape[0] == 1 else nm])


def with_cfg(paired: Velocity, scale: float) -> Velocity:
    """Krea's classifier-free guidance v = v_c + scale (v_c - v_u) as a velocity function.

    `paired` is one velocity over the doubled batch [x; x]: its first B rows conditioned
    on the prompts, its last B on the negative (see `with_negative`). Both halves run in
    one forward. Returns float32 velocities [B, C, H, W].
    """

    def velocity(x: Tensor, t: Tensor) -> Tensor:
        b = x.shape[0]
        v2 = paired(torch.cat([x, x]), torch.cat([t, t])).float()
        return guided_velocity(v2[:b], v2[b:], scale)

    return velocity


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


def euler_step(
    velocity: Velocity, x: Tensor, t: float, t_next: float, dtype: torch.dtype
) -> Tensor:
    """x + (t_next - t) velocity(x, t) for the float32 state x [B, C, H, W]; the velocity
    sees x cast to `dtype` (the model's) and t as a float32 [B] tensor."""
    tb = torch.full((x.shape[0],), t, device=x.device)
    return x + (t_next - t) * velocity(x.to(dtype), tb).float()


@torch.no_grad()
def euler_sample(
    velocity: Velocity,
    noise: Tensor,
    times: Tensor,
    on_step: Callable[[int, Tensor], None] | None = None,
) -> Tensor:
    """Integrate from times[0] (= 1, noise [B, C, H, W]) to times[-1] (= 0) by Euler steps.

    The state is kept in float32 between steps; the velocity sees it in noise's dtype.
    `on_step(i, x)` is called after step i. Returns data [B, C, H, W] in noise's dtype.
    """
    x = noise.float()
    times = times.to(torch.float64)
    for i in range(len(times) - 1):
        x = euler_step(velocity, x, float(times[i]), float(times[i + 1]), noise.dtype)
        if on_step is not None:
            on_step(i, x)
    return x.to(noise.dtype)
