"""Supervised fine-tuning of the expander with trl's `SFTTrainer`.

Examples are chats (`krea2.expander.sft_data`); they are split into trl's prompt-completion
form (system + user as the prompt, the assistant turn as the completion), so the loss is on
the thinking trace and the expansion only. Production: a Qwen3 checkpoint from a local path
(`base`), bf16 on GPUs; the toy: a tokenizer trained on the chats and a tiny Qwen3 from a
config, learned from scratch on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krea2.expander.toy_model import ToyModelConfig, load_model, tiny_qwen3, train_tokenizer

__all__ = ["SftConfig", "generate", "prompt_completion", "run_sft"]


@dataclass(frozen=True)
class SftConfig:
    """``base``: a local Qwen3 folder, or None for the toy model (``toy`` sizes it, its
    tokenizer trained on the examples with ``vocab_size``). Steps, batch and learning rate
    as in trl; ``max_length`` in tokens (longer chats are truncated, which trl reports).
    ``gradient_checkpointing``: None turns it on where it saves accelerator memory (CUDA)
    and off on the CPU, where it only costs a second forward (trl's default is on)."""

    base: str | None = None
    toy: ToyModelConfig = field(default_factory=ToyModelConfig)
    vocab_size: int = 1024
    steps: int = 600
    batch_size: int = 16
    lr: float = 3e-3
    warmup_ratio: float = 0.05
    max_length: int = 384
    seed: int = 0
    bf16: bool = False
    log_every: int = 20
    gradient_checkpointing: bool | None = None

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0 or self.max_length < 16:
            raise ValueError(f"{self}: steps and batch_size >= 1, lr > 0, max_length >= 16")


def checkpointing(asked: bool | None) -> bool:
    """Gradient checkpointing as asked; None: on with CUDA (memory), off on the CPU (the
    recomputed forward is a third of a toy step's time there, and memory is not short)."""
    if asked is not None:
        return asked
    import torch

    return torch.cuda.is_available()


def prompt_completion(example: dict) -> dict:
    """A chat example as trl's conversational prompt-completion pair."""
    messages = example["messages"]
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("an SFT chat must end with the assistant's turn")
    return {"prompt": messages[:-1], "completion": messages[-1:]}


def _texts(examples: Sequence[dict]) -> list[str]:
    return [m["content"] for e in examples for m in e["messages"]]


def run_sft(examples: Sequence[dict], out: Path, config: SftConfig | None = None) -> dict:
    """Train on ``examples`` and save model + tokenizer to ``out`` (loadable by
    `load_model`). Returns ``{"losses": [(step, loss)...], "examples": n, "out": str}``."""
    import datasets
    from transformers import PrinterCallback
    from trl import SFTConfig as TrlSftConfig
    from trl import SFTTrainer

    from krea2.expander.hf_progress import KreaProgress, quiet_hf

    quiet_hf()
    cfg = config or SftConfig()
    if not examples:
        raise ValueError("no SFT examples: nothing to train on")
    if cfg.base is None:
        tokenizer = train_tokenizer(_texts(examples), cfg.vocab_size)
        model = tiny_qwen3(tokenizer, cfg.toy, seed=cfg.seed)
    else:
        model, tokenizer = load_model(cfg.base, dtype="bfloat16" if cfg.bf16 else "auto")
    rows = [prompt_completion(e) for e in examples]
    data = datasets.Dataset.from_list(rows)
    args = TrlSftConfig(
        output_dir=str(out / "trainer"),
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        warmup_steps=max(1, round(cfg.warmup_ratio * cfg.steps)),
        lr_scheduler_type="cosine",
        max_length=cfg.max_length,
        logging_steps=cfg.log_every,
        save_strategy="no",
        report_to=[],
        seed=cfg.seed,
        bf16=cfg.bf16,
        use_cpu=cfg.base is None and not cfg.bf16,
        dataloader_num_workers=0,
        disable_tqdm=True,
        gradient_checkpointing=checkpointing(cfg.gradient_checkpointing),
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(KreaProgress("expander sft"))
    trainer.train()
    out.mkdir(parents=True, exist_ok=True)
    trainer.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    return {"losses": losses, "examples": len(rows), "out": str(out)}


def generate(
    model: Any,
    tokenizer: Any,
    requests: Sequence[str],
    max_new_tokens: int = 256,
    **sampling: Any,
) -> list[str]:
    """The assistant text for each request (greedy unless ``sampling`` says otherwise),
    batched with left padding."""
    import torch

    from krea2.expander.sft_data import SYSTEM_PROMPT

    tokenizer.padding_side = "left"
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": r}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for r in requests
    ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        ids = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=bool(sampling),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
    new = ids[:, batch["input_ids"].shape[1] :]
    texts = tokenizer.batch_decode(new, skip_special_tokens=False)
    return [t.split(tokenizer.eos_token, 1)[0].replace(tokenizer.pad_token, "") for t in texts]
