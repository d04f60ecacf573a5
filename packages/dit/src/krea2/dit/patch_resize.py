"""Carry weights across a change of patch size (FlexiViT-style resize of the pixel-facing layers).

Only the two layers that touch patch pixels depend on the patch: the patch embedding
``first`` [D, C*p*p] and the final projection ``last.linear`` [C*p*p, D] (feature index
``c*p*p + ph*p + pw``, as in ``patchify``). Every other weight is shared by any patch size.

The resize keeps the model's function on images that are resolution changes of each other:
going from patch p to k*p (the same token grid on a k-times larger image), the new
embedding reads the k x k average of each old pixel's block, and the new projection
writes each old output pixel to its k x k block (nearest upsampling). So a model trained
at 32 px with patch 4 starts a 64 px stage with patch 8 as its own upsampled self, at the
same token count and cost per step. Going down (patch k*p to p) is the adjoint: the
embedding sums a block's weights, the projection averages them.
"""

from __future__ import annotations

from torch import Tensor

from krea2.infra.errors import UserError

EMBED_WEIGHT = "first.weight"
# The keys whose shapes depend on the patch, and the axis that holds the C*p*p features.
PATCH_AXES = {EMBED_WEIGHT: 1, "last.linear.weight": 0, "last.linear.bias": 0}


def shapes_at_patch(
    state: dict[str, Tensor], patch: int, channels: int, prefix: str = ""
) -> dict[str, tuple[int, ...]]:
    """The shapes that ``state``'s patch-dependent keys (with ``prefix``) have at ``patch``."""
    shapes = {}
    for key, axis in PATCH_AXES.items():
        shape = list(state[prefix + key].shape)
        shape[axis] = channels * patch * patch
        shapes[prefix + key] = tuple(shape)
    return shapes


def resize_patch_weights(
    state: dict[str, Tensor], old_patch: int, new_patch: int, channels: int, prefix: str = ""
) -> dict[str, Tensor]:
    """A copy of ``state`` with ``first`` and ``last.linear`` resized from ``old_patch`` to
    ``new_patch`` (one must divide the other); keys may carry ``prefix`` (e.g. "dit.").

    ``channels``: latent channels C. Shapes: ``first.weight`` [D, C*p*p] and
    ``last.linear.weight`` [C*p*p, D], ``last.linear.bias`` [C*p*p]; other keys unchanged.
    """
    if old_patch == new_patch:
        return dict(state)
    big, small = max(old_patch, new_patch), min(old_patch, new_patch)
    if big % small:
        raise UserError(
            f"cannot resize patch {old_patch} -> {new_patch}: one patch size must divide the "
            f"other (e.g. 4 -> 8)"
        )
    out = dict(state)
    for key, axis in PATCH_AXES.items():
        name = prefix + key
        if name not in state:
            raise UserError(f"resize_patch_weights: state has no {name!r}")
        w = state[name]
        expected = channels * old_patch * old_patch
        if w.shape[axis] != expected:
            raise UserError(
                f"{name} has {w.shape[axis]} patch features; expected {expected} "
                f"(channels {channels} x patch {old_patch}^2)"
            )
        out[name] = _resize(w, axis, old_patch, new_patch, channels, embed=key == EMBED_WEIGHT)
    return out


def _resize(w: Tensor, axis: int, old: int, new: int, channels: int, embed: bool) -> Tensor:
    x = w.movedim(axis, -1)  # [..., C*p*p]
    lead = x.shape[:-1]
    x = x.reshape(*lead, channels, old, old)
    if new > old:
        k = new // old
        x = x.repeat_interleave(k, dim=-2).repeat_interleave(k, dim=-1)
        if embed:  # the embedding averages the k x k pixels that one old pixel became
            x = x / (k * k)
    else:
        k = old // new
        x = x.unflatten(-1, (new, k)).unflatten(-3, (new, k))  # [..., C, new, k, new, k]
        x = x.sum(dim=(-3, -1)) if embed else x.mean(dim=(-3, -1))
    return x.reshape(*lead, channels * new * new).movedim(-1, axis).contiguous().to(w.dtype)
