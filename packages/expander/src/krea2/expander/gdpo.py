"""GDPO for the expander on trl's GRPOTrainer: image, faithfulness and diversity rewards,
normalised per reward within each group and summed with weights, then normalised over the
batch (trl's ``multi_objective_aggregation="normalize_then_sum"``), with safety gates.

trl sums rewards; it has no gate. `GatedGRPOTrainer` adds one where the advantages are
final: a gated completion gets the lowest advantage of its batch, and never more than 0,
so a gated expansion is never reinforced however well it scores otherwise. The share of
gated completions is logged as ``gate/rate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from trl import GRPOTrainer

from krea2.expander.rewards import ExpanderRewards
from krea2.expander.sft import checkpointing
from krea2.expander.sft_data import SYSTEM_PROMPT

__all__ = ["GatedGRPOTrainer", "GdpoConfig", "run_gdpo"]


class GatedGRPOTrainer(GRPOTrainer):
    """A GRPOTrainer whose ``expander_rewards.gate`` caps gated completions' advantages."""

    def __init__(self, *args: Any, expander_rewards: ExpanderRewards, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expander_rewards = expander_rewards
        self._gated: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        from accelerate.utils import gather

        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        gated = self.expander_rewards.score(prompts, completions)["gated"]
        self._gated = gather(torch.as_tensor(gated, device=rewards.device))
        return rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        advantages = out["advantages"]
        n = advantages.shape[0]
        start = self.accelerator.process_index * n
        gated = self._gated[start : start + n] if self._gated is not None else None
        mode = "train" if self.model.training else "eval"
        if gated is not None:
            self._metrics[mode]["gate/rate"].append(gated.float().mean().item())
            if gated.any():
                floor = torch.clamp(advantages.min(), max=0.0)
                out["advantages"] = torch.where(gated.to(advantages.device), floor, advantages)
        return out


@dataclass(frozen=True)
class GdpoConfig:
    """GDPO run settings. ``weights``: reward name -> weight (names from
    `ExpanderRewards.names`; a missing name weighs 1). ``num_generations``: G per request;
    ``beta``: KL to the SFT model (0 = none); ``temperature`` for rollouts. ``use_vllm``
    generates the rollouts with vLLM (the ``[vllm]`` extra): ``vllm_mode = "colocate"``
    runs it inside the training processes, ``"server"`` asks a ``trl vllm-serve`` server
    (``vllm_server_url``). ``gradient_checkpointing`` as
    :func:`krea2.expander.sft.checkpointing` (None: on with CUDA, off on the CPU)."""

    steps: int = 100
    prompts_per_step: int = 4
    num_generations: int = 4
    lr: float = 5e-5
    beta: float = 0.0
    temperature: float = 1.0
    max_completion_length: int = 160
    weights: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_server_url: str = "http://127.0.0.1:8000"
    log_every: int = 5
    gradient_checkpointing: bool | None = None

    def __post_init__(self) -> None:
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2: advantages compare a group")
        if self.steps < 1 or self.prompts_per_step < 1 or self.lr <= 0:
            raise ValueError(f"{self}: steps and prompts_per_step >= 1, lr > 0")
        if self.vllm_mode not in ("colocate", "server"):
            raise ValueError(f"vllm_mode {self.vllm_mode!r}: 'colocate' or 'server'")


def run_gdpo(
    model: Any,
    tokenizer: Any,
    requests: Sequence[str],
    rewards: ExpanderRewards,
    out: Path,
    config: GdpoConfig | None = None,
) -> dict:
    """Train ``model`` (the SFT expander) with GDPO on ``requests``; save it to ``out``.
    Returns ``{"history": trl's log history, "out": str}``."""
    import datasets
    from transformers import PrinterCallback
    from trl import GRPOConfig

    from krea2.expander.hf_progress import KreaProgress, quiet_hf

    quiet_hf()
    cfg = config or GdpoConfig()
    if rewards.num_generations != cfg.num_generations:
        raise ValueError(
            f"rewards group {rewards.num_generations} != num_generations {cfg.num_generations}"
        )
    unknown = set(cfg.weights) - set(rewards.names)
    if unknown:
        raise ValueError(f"weights for unknown rewards {sorted(unknown)}; have {rewards.names}")
    data = datasets.Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": r},
                ]
            }
            for r in requests
        ]
    )
    batch = cfg.prompts_per_step * cfg.num_generations
    args = GRPOConfig(
        output_dir=str(out / "trainer"),
        max_steps=cfg.steps,
        per_device_train_batch_size=batch,
        num_generations=cfg.num_generations,
        learning_rate=cfg.lr,
        beta=cfg.beta,
        temperature=cfg.temperature,
        max_completion_length=cfg.max_completion_length,
        multi_objective_aggregation="normalize_then_sum",
        reward_weights=[cfg.weights.get(n, 1.0) for n in rewards.names],
        logging_steps=cfg.log_every,
        save_strategy="no",
        report_to=[],
        seed=cfg.seed,
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        vllm_server_base_url=cfg.vllm_server_url if cfg.vllm_mode == "server" else None,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
        gradient_checkpointing=checkpointing(cfg.gradient_checkpointing),
    )
    trainer = GatedGRPOTrainer(
        model=model,
        reward_funcs=rewards.reward_funcs(),
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        expander_rewards=rewards,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(KreaProgress("expander gdpo"))
    trainer.train()
    out.mkdir(parents=True, exist_ok=True)
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"history": trainer.state.log_history, "out": str(out)}
