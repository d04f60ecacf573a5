"""DiffusionNFT's sampling ("old") policy: an exponential moving average of the trained
weights that rolls out the images and gives v_old in the loss.

With v_old the current weights (decay 0) the NFT gradient is 2β(2r - 1)(v_θ - target):
an advantage-weighted flow-matching step with nothing holding the policy back, so a
large learning rate walks it off (docs/rl.md, the proof's lr 6e-3 run). With v_old
lagging, the gradient gains 2β²(v_θ - v_old): a pull towards the sampling policy, a trust
region whose width the decay sets (Zheng et al. 2025 soft-update the old adapter the same
way). The average is the trainer's :class:`krea2.trainer.WeightEma` (trainable
parameters only, swapped in bit-exactly for the no-grad forwards).
"""

from __future__ import annotations

from krea2.trainer import WeightEma


class OldPolicy(WeightEma):
    """The EMA ``old = decay · old + (1 - decay) · θ`` of ``params`` (the stage's trainable
    parameters, plain tensors or DTensors), starting at their current values."""
