"""A stage that starts from another run's checkpoint reads the patch it was saved at."""

from __future__ import annotations

import torch

from krea2.infra import CheckpointManager
from krea2.trainer.warmstart import _saved_patch


def test_the_saved_patch_is_read_from_the_first_layer_of_a_stage_folder_or_one_checkpoint(
    tmp_path,
):
    root = tmp_path / "checkpoints" / "pretrain-64"
    manager = CheckpointManager(root)
    # a 64 px stage of the demo: patch 8 over 3 pixel channels -> 192 inputs per token
    step = manager.save(5, {"model": {"dit.first.weight": torch.zeros(128, 192)}})
    assert _saved_patch(root, channels=3) == 8
    assert _saved_patch(step, channels=3) == 8
    assert _saved_patch(tmp_path / "nothing", channels=3) is None
    other = CheckpointManager(tmp_path / "odd")
    other.save(1, {"model": {"dit.first.weight": torch.zeros(128, 50)}})  # not p^2 * 3
    assert _saved_patch(tmp_path / "odd", channels=3) is None
