"""Pinning the attention's SDPA kernel (`krea2.dit.set_attention_backend`): the same outputs
as PyTorch's own choice where the kernel runs, and a clear error where it cannot."""

from __future__ import annotations

import pytest
import torch

from krea2.dit import ATTENTION_BACKENDS, Krea2DiT, get_config, set_attention_backend
from krea2.dit.attention import Attention, sdpa_gqa
from krea2.dit.testing import make_inputs, randomize


def tiny_model() -> Krea2DiT:
    model = Krea2DiT(get_config("tiny")).eval()
    randomize(model, seed=0, std=0.1)
    return model


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_a_kernel_that_runs_on_the_cpu_gives_the_auto_outputs(backend: str) -> None:
    model = tiny_model()
    img, txt, t, pos, mask = make_inputs(model.cfg)  # text of two lengths: a key mask
    with torch.no_grad():
        want = model(img, txt, t, pos, mask)
        set_attention_backend(model, backend)
        assert {m.backend for m in model.modules() if isinstance(m, Attention)} == {backend}
        got = model(img, txt, t, pos, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_gqa_under_a_pinned_kernel_matches_repeated_heads() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8, generator=g), *torch.randn(2, 2, 2, 6, 8, generator=g)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    )
    for backend in ("math", "flash"):
        torch.testing.assert_close(sdpa_gqa(q, k, v, None, backend), want)


@pytest.mark.parametrize("backend", ["cudnn", "efficient"])
def test_a_cuda_kernel_on_the_cpu_is_refused_with_the_choices_that_run(backend: str) -> None:
    model = tiny_model()
    set_attention_backend(model, backend)
    with pytest.raises(RuntimeError, match=f"{backend}.*only on CUDA.*auto, flash or math"):
        model(*make_inputs(model.cfg))


def test_an_unknown_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="choose one of auto, cudnn, flash, efficient, math"):
        set_attention_backend(tiny_model(), "sdpa")
    assert ATTENTION_BACKENDS[0] == "auto"
    assert all(m.backend == "auto" for m in tiny_model().modules() if isinstance(m, Attention))
