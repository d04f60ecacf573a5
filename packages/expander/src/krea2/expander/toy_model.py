"""The toy expander: a tokenizer trained on ShapesWorld text and a tiny Qwen3 from a config.

Production starts from a Qwen3 checkpoint at a local path (`load_model`); no weights can be
downloaded here, so the toy builds the same architecture at a small size with random
weights and learns it from scratch on CPU. The tokenizer is a byte-level BPE (the Qwen
family's kind, so any text round-trips) trained with the `tokenizers` library on the SFT
chats, with Qwen's chat markers as special tokens and a Qwen-style chat template.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "ToyModelConfig",
    "load_model",
    "tiny_qwen3",
    "train_tokenizer",
]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")

# Qwen's layout: each turn is <|im_start|>role\ncontent<|im_end|>\n; a generation prompt
# opens the assistant turn. Rendering the prompt is a prefix of rendering prompt + answer,
# which trl's prompt-completion SFT relies on to mask the prompt out of the loss.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` trained on ``texts``
    (:func:`krea2.dit.build_tokenizer`), with the chat markers as single tokens,
    ``<|endoftext|>`` as pad and `CHAT_TEMPLATE`.

    As in Qwen3, ``<think>``/``</think>`` are single tokens but not *special* ones: trl
    decodes completions with ``skip_special_tokens=True``, and a reward must still see
    where the trace ends and the expansion begins."""
    from krea2.dit import build_tokenizer

    return build_tokenizer(
        texts, vocab_size, template_text=False, added_tokens=SPECIAL_TOKENS[3:],
        chat_template=CHAT_TEMPLATE,
    )  # fmt: skip


@dataclass(frozen=True)
class ToyModelConfig:
    """Size of the toy Qwen3 (Qwen3's architecture: GQA, RMSNorm, SwiGLU, q/k norms)."""

    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384
    max_positions: int = 512


def tiny_qwen3(tokenizer: Any, config: ToyModelConfig | None = None, seed: int = 0) -> Any:
    """A randomly initialised `Qwen3ForCausalLM` sized by ``config`` over ``tokenizer``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    c = config or ToyModelConfig()
    if c.hidden % c.heads or c.heads % c.kv_heads:
        raise ValueError(f"{c}: hidden must divide by heads and heads by kv_heads")
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=c.hidden,
        intermediate_size=c.intermediate,
        num_hidden_layers=c.layers,
        num_attention_heads=c.heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.hidden // c.heads,
        max_position_embeddings=c.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(cfg)


def load_model(path: str | Path, dtype: str = "auto") -> tuple[Any, Any]:
    """(model, tokenizer) from a local folder (a Qwen3 checkpoint or a saved toy run). A
    folder without weights or tokenizer is named in one line, never fetched from a hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path)
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    if not folder.is_dir() or not (folder / "config.json").exists() or not has_weights:
        raise FileNotFoundError(
            f"{folder}: no model here (need config.json and *.safetensors); pass the local "
            "folder of a Qwen3 checkpoint or of `krea2 expander sft`'s output"
        )
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    return model, tokenizer
