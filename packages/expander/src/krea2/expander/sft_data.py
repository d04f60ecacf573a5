"""SFT data for the expander: (synthetic user prompt -> thinking trace + long caption) chats.

Two sources, one output (trl's conversational format, a ``messages`` list per example):

- ShapesWorld: training shards exported by curate carry each scene's JSON caption;
  `krea2.expander.user_prompts` writes the short requests by rule, knowing what they dropped.
- Real captions: an LLM behind an OpenAI-compatible server (vLLM in production) writes the
  short request and the thinking trace from a long caption (`LlmUserPrompts`).

Distribution shaping (report §8): visually rich / artistic captions are oversampled
(``rich``, the number of requests written per rich caption), and captions that read as
photographs ask the LLM to keep the photographic medium in the request with probability
``photo_medium`` (a light bias: users who want a photo usually say so).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from krea2.curate import VlmClient
from krea2.curate.shapes import Scene
from krea2.expander.user_prompts import UserPromptConfig, scene_weight, user_prompt

__all__ = [
    "SYSTEM_PROMPT",
    "LlmUserPrompts",
    "Shaping",
    "assistant_turn",
    "chat_example",
    "is_visually_rich",
    "read_shard_scenes",
    "reads_as_photo",
    "shapes_sft_examples",
    "split_answer",
]

# Short: it is part of every training and serving sequence. The rules it states are
# what the rewards check (faithfulness to the request; details added, none contradicted).
SYSTEM_PROMPT = (
    "Expand the user's image request into one detailed prompt. Think briefly first. Keep "
    "every requested detail exactly; add the rest."
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Shaping:
    """Distribution weights, documented in docs/expander.md. ``rich``: requests written per
    visually rich caption (others get one); ``photo_medium``: probability that a caption
    that reads as a photograph keeps "photo" in its request."""

    rich: int = 2
    photo_medium: float = 0.3

    def __post_init__(self) -> None:
        if self.rich < 1:
            raise ValueError(f"shaping.rich = {self.rich}: at least one request per caption")
        if not 0.0 <= self.photo_medium <= 1.0:
            raise ValueError(f"shaping.photo_medium = {self.photo_medium} is a probability")


def assistant_turn(thinking: str, expansion: str) -> str:
    """The assistant's text: the trace in a think block, then the expansion (Qwen3's layout)."""
    return f"{THINK_OPEN}\n{thinking}\n{THINK_CLOSE}\n\n{expansion}"


def split_answer(text: str) -> tuple[str, str]:
    """(thinking, expansion) of an assistant text; an answer without a closed think block
    is all expansion (a model may skip thinking), with the open tag removed."""
    if THINK_CLOSE in text:
        thinking, expansion = text.split(THINK_CLOSE, 1)
        return thinking.replace(THINK_OPEN, "").strip(), expansion.strip()
    return "", text.replace(THINK_OPEN, "").strip()


def chat_example(request: str, thinking: str, expansion: str) -> dict[str, list[dict[str, str]]]:
    """One SFT example in trl's conversational format."""
    return {
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": request},
            {"role": "assistant", "content": assistant_turn(thinking, expansion)},
        ]
    }


def read_shard_scenes(paths: Iterable[Path]) -> list[Scene]:
    """The scene of every row of ShapesWorld training shards (from its ``json`` caption),
    in file and row order; a row without one raises naming the file and key."""
    import pyarrow.parquet as pq

    scenes = []
    for path in paths:
        table = pq.read_table(path, columns=["key", "captions"])
        for row in table.to_pylist():
            text = next((c["text"] for c in row["captions"] if c["format"] == "json"), None)
            if text is None:
                raise ValueError(f"{path}: row {row['key']} has no json caption (scene spec)")
            scenes.append(Scene.from_json(text))
    return scenes


def shapes_sft_examples(
    scenes: Sequence[Scene],
    seed: int = 0,
    config: UserPromptConfig | None = None,
    shaping: Shaping | None = None,
) -> list[dict]:
    """SFT chats for ``scenes``: one synthetic request per scene, ``shaping.rich`` per
    visually rich scene, each with its trace and the scene's long caption as the answer.
    Each example also carries ``kept``/``dropped`` requirement descriptions (not trained on)."""
    shaping = shaping or Shaping()
    rng = np.random.default_rng(seed)
    out = []
    for scene in scenes:
        for _ in range(shaping.rich if scene_weight(scene) > 1 else 1):
            p = user_prompt(scene, rng, config)
            example = chat_example(p.text, p.thinking, p.target)
            example["kept"] = [r.describe() for r in p.kept]
            example["dropped"] = [r.describe() for r in p.dropped]
            out.append(example)
    return out


_PHOTO = re.compile(
    r"\b(photo(graph)?|shot on|dslr|35 ?mm|bokeh|depth of field|f/\d|iso \d+|lens)\b", re.I
)
LLM_PROMPT = (
    "Here is a detailed image caption. Write the short request a user might have typed to get "
    "this image: {register}, at most 15 words, keeping only the main subject and at most one "
    "or two details, dropping most visual detail.{medium} Then write a short thinking trace "
    "(2-3 sentences) that reconstructs the user's intent from the request alone. Answer with "
    'JSON only: {{"request": <str>, "thinking": <str>}}.'
)
REGISTERS = ("conversational", "a bare list of tags", "a short instruction")


_RICH = re.compile(
    r"\b(painting|illustration|watercolou?r|oil|gouache|ink|sketch|render|cinematic|"
    r"dramatic|surreal|ornate|intricate|vibrant|neon|golden hour|chiaroscuro|texture[sd]?|"
    r"pattern|gradient|palette|composition|art ?deco|baroque|ukiyo-e|collage|poster)\b",
    re.I,
)


def is_visually_rich(caption: str) -> bool:
    """True for artistic or visually dense captions (art vocabulary, or over 60 words):
    the ones the report oversamples."""
    return bool(_RICH.search(caption)) or len(caption.split()) > 60


def reads_as_photo(caption: str) -> bool:
    """True when a caption describes a photograph (camera or photo vocabulary)."""
    return bool(_PHOTO.search(caption))


def _parse_request(answer: str) -> tuple[str, str]:
    text = answer.strip().removeprefix("```json").removeprefix("```").removesuffix("```")
    try:
        data = json.loads(text)
        request, thinking = str(data["request"]).strip(), str(data["thinking"]).strip()
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"not a request/thinking JSON: {answer[:200]!r}") from exc
    if not request or not thinking:
        raise ValueError(f"empty request or thinking: {answer[:200]!r}")
    return request, thinking


class LlmUserPrompts:
    """Short requests and thinking traces for real long captions from an LLM behind an
    OpenAI-compatible server. Garbage answers are asked again; a caption that still fails
    is returned as the exception (nothing else in the batch is lost)."""

    def __init__(self, client: VlmClient, shaping: Shaping | None = None, seed: int = 0) -> None:
        self.client, self.shaping = client, shaping or Shaping()
        self.rng = np.random.default_rng(seed)

    def messages(self, caption: str) -> list[dict[str, str]]:
        register = REGISTERS[int(self.rng.integers(len(REGISTERS)))]
        keep_photo = reads_as_photo(caption) and self.rng.random() < self.shaping.photo_medium
        medium = " Say that it is a photo." if keep_photo else ""
        return [
            {"role": "system", "content": LLM_PROMPT.format(register=register, medium=medium)},
            {"role": "user", "content": caption},
        ]

    def _copies(self, caption: str) -> int:
        return self.shaping.rich if is_visually_rich(caption) else 1

    def __call__(self, captions: Sequence[str]) -> list[dict | Exception]:
        """One example (or the exception that stopped it) per request written: a visually
        rich caption gets ``shaping.rich`` requests, in order."""
        chosen = [c for c in captions for _ in range(self._copies(c))]
        answers = self.client.ask_many([self.messages(c) for c in chosen], _parse_request)
        out: list[dict | Exception] = []
        for caption, answer in zip(chosen, answers, strict=True):
            if isinstance(answer, Exception):
                out.append(answer)
            else:
                out.append(chat_example(answer[0], answer[1], caption))
        return out
