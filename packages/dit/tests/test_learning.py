"""The model, the flow loss and the sampler together learn: a tiny conditional toy problem."""

from __future__ import annotations

import torch

from krea2.dit import flow
from krea2.dit.config import get_config
from krea2.dit.model import Krea2DiT
from krea2.dit.pixel_ae import PixelAE
from krea2.dit.sampler import dit_velocity, euler_sample, seeded_noise


def test_tiny_dit_learns_two_prompt_conditioned_images():
    """Two prompts, two target images: after training, sampling each prompt gives its image."""
    torch.manual_seed(0)
    cfg = get_config("tiny", latent_channels=3, patch=2, depth=2)
    model = Krea2DiT(cfg)
    ae = PixelAE()
    g = torch.Generator().manual_seed(0)
    targets = torch.stack([torch.full((3, 8, 8), -0.8), torch.full((3, 8, 8), 0.8)])
    targets[1, :, :4] = -0.8  # image 1: left half dark, right half bright
    txt = torch.randn(2, 4, cfg.text_taps, cfg.text_dim, generator=g)
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]], dtype=torch.bool)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        idx = torch.randint(0, 2, (16,), generator=g)
        data = ae.encode(targets[idx])
        noise = torch.randn(data.shape, generator=g)
        t = flow.sample_training_times(16, mu=0.0, generator=g)
        v = model.velocity(flow.interpolate(data, noise, t), txt[idx], t, mask[idx])
        loss = (v - flow.velocity_target(data, noise)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    noise = seeded_noise([1, 2, 3, 4], (3, 8, 8))
    which = torch.tensor([0, 1, 0, 1])
    velocity = dit_velocity(model, txt[which], mask[which])
    out = euler_sample(velocity, noise, flow.sampling_times(16, 0.0))
    err = (ae.decode(out) - targets[which]).abs().mean(dim=(1, 2, 3))
    swapped = (ae.decode(out) - targets[1 - which]).abs().mean(dim=(1, 2, 3))
    assert err.max() < 0.15, err  # each sample is its prompt's image ...
    assert swapped.min() > 0.5, swapped  # ... and not the other prompt's
