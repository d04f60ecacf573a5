"""A small byte-level BPE tokenizer built in code (tests and toys), with Qwen's chat tokens."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from krea2.dit.prompt_template import ROLES, SYSTEM_PROMPT

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PAD_TOKEN = "<|endoftext|>"  # Qwen's pad token


def build_tokenizer(
    corpus: Iterable[str] = (),
    vocab_size: int = 512,
    *,
    template_text: bool = True,
    added_tokens: Sequence[str] = (),
    chat_template: str | None = None,
) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on the prompt template (``template_text``) plus the caller's
    ``corpus`` lines; the one toy tokenizer of the project (the DiT's text encoder and the
    prompt expander's toy Qwen3 both build theirs here).

    Any text encodes (no unknown tokens); ``corpus`` only decides which words get merged
    into few tokens, so callers pass their own vocabulary (e.g. their world's prompts).
    Deterministic for a given corpus. Qwen's chat special tokens (``<|im_start|>`` and
    ``<|im_end|>`` also as additional special tokens, so decoding with
    ``skip_special_tokens`` drops them), `<|endoftext|>` as pad, `<|im_end|>` as eos, right
    padding. ``added_tokens`` become single tokens that are *not* special (as Qwen3's
    ``<think>``/``</think>``: a decoder that skips special tokens still sees them);
    ``chat_template``: the tokenizer's Jinja chat template.
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
    texts = [SYSTEM_PROMPT, *ROLES, *corpus] if template_text else corpus
    tok.train_from_iterator(texts, trainer=trainer)
    if added_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token="<|im_end|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        padding_side="right",
    )
    if chat_template is not None:
        out.chat_template = chat_template
    return out
