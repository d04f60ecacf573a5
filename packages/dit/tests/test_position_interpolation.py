"""Position interpolation (``rope_ref_grid``): positions that span the same range at any size."""

from __future__ import annotations

import pytest
import torch

from krea2.dit.config import get_config
from krea2.dit.diffusers_config import to_diffusers_config
from krea2.dit.model import Krea2DiT
from krea2.dit.patches import image_positions
from krea2.infra.errors import UserError


def test_a_grid_twice_as_fine_lands_between_the_coarse_positions():
    coarse = image_positions(2, 4, 4, ref_grid=4)
    fine = image_positions(2, 8, 8, ref_grid=4)
    torch.testing.assert_close(coarse, image_positions(2, 4, 4), rtol=0, atol=0)
    assert fine[:2].abs().sum() == 0  # text stays at position 0
    rows = fine[2:, 1].view(8, 8)[:, 0]
    torch.testing.assert_close(rows, torch.arange(8) / 2.0)
    # A non-square grid keeps its aspect: one scale for both axes.
    wide = image_positions(0, 4, 16, ref_grid=8)
    assert wide[:, 1].max() == pytest.approx(3.0) and wide[:, 2].max() == pytest.approx(15.0)


def test_the_model_sees_interpolated_positions_and_the_release_default_is_unchanged():
    torch.manual_seed(0)
    base = Krea2DiT(get_config("tiny"))
    interp = Krea2DiT(get_config("tiny", rope_ref_grid=2))
    interp.load_state_dict(base.state_dict())
    txt = torch.randn(1, 3, 3, 16)
    t = torch.tensor([0.5])
    same = torch.randn(1, 4, 4, 4)  # a 2x2 token grid: ref_grid=2 changes nothing
    torch.testing.assert_close(
        base.velocity(same, txt, t), interp.velocity(same, txt, t), rtol=0, atol=0
    )
    finer = torch.randn(1, 4, 8, 8)  # 4x4 tokens: positions halve, so the output differs
    assert (base.velocity(finer, txt, t) - interp.velocity(finer, txt, t)).abs().max() > 1e-4


def test_position_interpolation_is_refused_where_it_cannot_be_expressed():
    with pytest.raises(UserError, match="rope_ref_grid"):
        get_config("tiny", rope_ref_grid=-1)
    with pytest.raises(UserError, match="diffusers"):
        to_diffusers_config(get_config("tiny", rope_ref_grid=8))
