"""krea2.rl: rewards and reward servers, preference pairs, Diffusion-DPO and STPO, GRPO,
TDM distillation.

Four parts, each a sub-package with its own ``__all__``:

* ``krea2.rl.rewards``: the reward contract (images + prompts → one score per image and
  named sub-scores), the reward kinds, their composition, and reward servers/clients;
* ``krea2.rl.preference``: preference pairs (on-policy generation, the pairs table, the
  annotation page) and preference optimization (Diffusion-DPO, STPO) on the trainer;
* ``krea2.rl.online``: multi-reward RL without CFG (GRPO on SDE rollouts, DiffusionNFT),
  prompt-pool curation and reward-hacking guards, on the trainer;
* ``krea2.rl.distill``: timestep and guidance distillation into a few-step CFG-free
  student (TDM, Turbo's objective; DMD2 as its ablation), on the trainer.

and ``krea2.rl.serving``: what every HTTP server here and in ``krea2.expander`` checks
first (a token off loopback, a capped body, bounded JSON), exported at this root.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.rl import distill as distill
    from krea2.rl import objectives as objectives
    from krea2.rl import online as online
    from krea2.rl import preference as preference
    from krea2.rl import rewards as rewards
    from krea2.rl import serving as serving
    from krea2.rl.serving import BadJson as BadJson
    from krea2.rl.serving import BodyTooLarge as BodyTooLarge
    from krea2.rl.serving import TokenRequired as TokenRequired
    from krea2.rl.serving import check_bind as check_bind
    from krea2.rl.serving import is_loopback as is_loopback
    from krea2.rl.serving import load_json as load_json
    from krea2.rl.serving import read_body as read_body
    from krea2.rl.serving import token_matches as token_matches

__version__ = "0.1.0"

_HOMES: dict[str, str | None] = {
    "rewards": None,
    "preference": None,
    "online": None,
    "distill": None,
    "serving": None,
    "objectives": None,
    "BadJson": "serving",
    "BodyTooLarge": "serving",
    "TokenRequired": "serving",
    "check_bind": "serving",
    "is_loopback": "serving",
    "load_json": "serving",
    "read_body": "serving",
    "token_matches": "serving",
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
