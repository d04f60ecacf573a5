"""SFT chats from ShapesWorld shards (by rule) and from real captions (an LLM on loopback)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from krea2.curate import VlmClient, VlmUnavailable, shapes
from krea2.expander.faithfulness import LlmFaithfulnessJudge
from krea2.expander.sft_data import (
    SYSTEM_PROMPT,
    LlmUserPrompts,
    Shaping,
    is_visually_rich,
    read_shard_scenes,
    reads_as_photo,
    shapes_sft_examples,
)
from krea2.infra.shards import write_shard


def _row(key: str, scene: shapes.Scene | None) -> dict:
    caps = shapes.captions(scene) if scene else {"long": "a photo"}
    return {
        "key": key, "image": b"png", "uri": None, "crop": None, "width": 32, "height": 32,
        "bucket": "32x32", "captions": [{"format": f, "text": t} for f, t in caps.items()],
        "meta": "{}",
    }  # fmt: skip


def test_shards_become_chats_with_a_think_block_and_the_long_caption(tmp_path):
    rng = np.random.default_rng(0)
    scenes = [shapes.sample_scene(rng, word_prob=0.3) for _ in range(12)]
    path = write_shard(
        [_row(f"k{i}", s) for i, s in enumerate(scenes)], tmp_path / "s.parquet",
        stage="pretrain-32", seed=0, batch_size=4,
    )  # fmt: skip
    assert read_shard_scenes([path]) == scenes
    examples = shapes_sft_examples(scenes, seed=1, shaping=Shaping(rich=2))
    rich = sum(
        len(s.objects) > 1 or s.background.kind != "solid" or s.word is not None for s in scenes
    )
    assert len(examples) == len(scenes) + rich
    first = examples[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[0]["content"] == SYSTEM_PROMPT
    think, answer = first[2]["content"].split("</think>\n\n")
    assert think.startswith("<think>\n") and "The user asks for" in think
    assert answer == shapes.captions(scenes[0])["long"]
    assert examples[0]["kept"] and all(isinstance(d, str) for d in examples[0]["dropped"])
    assert shapes_sft_examples(scenes, seed=1) == examples  # deterministic per seed


def test_a_shard_row_without_a_scene_is_named(tmp_path):
    path = write_shard(
        [_row("photo-7", None)], tmp_path / "s.parquet", stage="s", seed=0, batch_size=1
    )
    with pytest.raises(ValueError, match=r"s\.parquet: row photo-7 has no json caption"):
        read_shard_scenes([path])


def test_caption_shaping_reads_art_and_photographs():
    assert is_visually_rich("An oil painting of a harbour at golden hour")
    assert not is_visually_rich("A cat on a sofa")
    assert reads_as_photo("A DSLR photo of a cat, shallow depth of field")
    assert not reads_as_photo("A watercolor of a cat")
    with pytest.raises(ValueError, match="probability"):
        Shaping(photo_medium=2.0)


def test_llm_requests_are_parsed_garbage_is_asked_again_and_a_hopeless_caption_is_kept_apart(
    chat_server,
):
    server, url = chat_server
    seen: dict[str, int] = {}

    def answer(messages: list[dict]) -> str:
        caption = messages[1]["content"]
        seen[caption] = seen.get(caption, 0) + 1
        if caption.startswith("hopeless"):
            return "I'd rather not."
        if caption.startswith("flaky") and seen[caption] == 1:
            return "```json\n{broken"
        photo = "Say that it is a photo." in messages[0]["content"]
        request = ("a photo of " if photo else "") + caption.split()[1]
        return json.dumps({"request": request, "thinking": "They want one thing."})

    server.answer = answer
    client = VlmClient(url, retries=1, backoff_s=0.01)
    make = LlmUserPrompts(client, Shaping(rich=2, photo_medium=1.0), seed=0)
    out = make(["plain cat on a sofa", "flaky dog in a park", "hopeless x", "an oil painting"])
    assert len(out) == 5  # the painting is rich: two requests
    assert out[0]["messages"][1]["content"] == "cat"
    assert out[0]["messages"][2]["content"].endswith("\n\nplain cat on a sofa")
    assert out[1]["messages"][1]["content"] == "dog" and seen["flaky dog in a park"] == 2
    assert isinstance(out[2], ValueError) and "unusable answer" in str(out[2])
    photo = make(["a DSLR photo of a fox"])[0]
    assert photo["messages"][1]["content"].startswith("a photo of")
    client.close()


def test_the_llm_judge_scores_verdicts_and_a_dead_server_is_named(chat_server):
    server, url = chat_server
    server.answer = lambda messages: json.dumps(
        {"requirements": 4, "missing": ["the hat"], "contradicted": []}
    )
    client = VlmClient(url, retries=0)
    [verdict] = LlmFaithfulnessJudge(client)(["a cat in a hat"], ["a cat"])
    assert verdict.score == 0.75 and verdict.missing == ("the hat",) and not verdict.faithful
    server.answer = lambda messages: json.dumps(
        {"requirements": 1, "missing": ["a", "b"], "contradicted": []}
    )
    with pytest.raises(ValueError, match="inconsistent verdict"):
        LlmFaithfulnessJudge(client, garbage_retries=0)(["x"], ["y"])
    dead = VlmClient("http://127.0.0.1:9", retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(VlmUnavailable, match=r"127\.0\.0\.1:9"):
        LlmFaithfulnessJudge(dead)(["x"], ["y"])
