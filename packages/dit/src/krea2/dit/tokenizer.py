"""A small byte-level BPE tokenizer built in code (tests and toys), with Qwen's chat tokens."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from krea2.dit.prompt_template import ROLES, SYSTEM_PROMPT

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PAD_TOKEN = "<|endoftext|>"  # Qwen's pad token


def build_tokenizer(corpus: Iterable[str] = (), vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on the prompt template plus the caller's ``corpus`` lines.

    Any text encodes (no unknown tokens); ``corpus`` only decides which words get merged
    into few tokens, so callers pass their own vocabulary (e.g. their world's prompts).
    Deterministic for a given corpus. Qwen's chat special tokens, `<|endoftext|>` as pad,
    right padding.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([SYSTEM_PROMPT, *ROLES, *corpus], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD_TOKEN, eos_token="<|im_end|>", padding_side="right"
    )
