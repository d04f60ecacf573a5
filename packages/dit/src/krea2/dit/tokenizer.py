"""A small byte-level BPE tokenizer built in code (tests and the toy recipe), Qwen chat tokens."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PAD_TOKEN = "<|endoftext|>"  # Qwen's pad token

_COLORS = "red green blue yellow purple orange white black gray pink brown cyan magenta"
_SHAPES = "circle square triangle star hexagon diamond cross ring rectangle ellipse"
_PLACES = "top bottom left right center middle upper lower corner above below next to"
_WORDS = (
    "a an the of on in with and background solid gradient texture dark light small large big "
    "tiny shape shapes object objects image picture photo word text letters written says two "
    "three one describe detailing color size quantity spatial relationships system user "
    "assistant"
)


def corpus() -> list[str]:
    """The fixed training text: the prompt template plus the ShapesWorld vocabulary."""
    from krea2.dit.text import SYSTEM_PROMPT

    lines = [SYSTEM_PROMPT, _COLORS, _SHAPES, _PLACES, _WORDS, "system", "user", "assistant"]
    for c in _COLORS.split():
        for s in _SHAPES.split():
            lines.append(f"a {c} {s} in the top left on a dark background")
    return lines


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes, no unknown tokens) trained on corpus(); deterministic.

    Has Qwen's chat special tokens and `<|endoftext|>` as pad; right padding.
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
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD_TOKEN, eos_token="<|im_end|>", padding_side="right"
    )
    return fast
