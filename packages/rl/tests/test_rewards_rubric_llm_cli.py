"""The LLM/VLM rubric over an OpenAI-compatible API (a small deterministic local server), and
the ``score`` / ``serve-reward`` commands."""

from __future__ import annotations

import base64
import io
import json
import re
import threading
import time

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from PIL import Image

from krea2.curate import shapes
from krea2.infra.host import run_cli
from krea2.rl.rewards import OpenAICompatibleClient, RubricReward, ShapesRubricReward
from krea2.rl.rewards.cli import _standalone
from krea2.rl.rewards.rubric_llm import parse_requirements, parse_verdict


def _chat_app(calls: dict[str, int]) -> FastAPI:
    """Speaks ``/v1/chat/completions``: a system message asking to split → a JSON list of
    the prompt's clauses; an image + requirement → yes/no from the ShapesWorld verifier."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    def complete(body: dict) -> dict:
        messages = body["messages"]
        if messages[0]["role"] == "system":
            calls["split"] += 1
            clauses = re.split(r",|\band\b", messages[1]["content"])
            answer = json.dumps([c.strip() for c in clauses if c.strip()])
        else:
            calls["check"] += 1
            parts = messages[0]["content"]
            url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
            text = next(p["text"] for p in parts if p["type"] == "text")
            png = base64.b64decode(url.split(",", 1)[1])
            image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
            requirement = text.rsplit("Requirement: ", 1)[1]
            answer = "Yes." if shapes.verify(requirement, image).score == 1.0 else "No."
        return {"choices": [{"message": {"role": "assistant", "content": answer}}]}

    return app


@pytest.fixture(scope="module")
def chat_server():
    calls = {"split": 0, "check": 0}
    server = uvicorn.Server(
        uvicorn.Config(_chat_app(calls), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", calls
    server.should_exit = True
    thread.join(timeout=10)


def test_parsers_read_json_lists_bullets_and_yes_no():
    assert parse_requirements('Sure: ["a cat", "a hat"]') == ["a cat", "a hat"]
    assert parse_requirements("- a cat\n2. a hat\n") == ["a cat", "a hat"]
    assert parse_verdict("Yes, it does") == 1.0 and parse_verdict("no") == 0.0
    assert np.isnan(parse_verdict("maybe"))


def test_llm_rubric_scores_met_requirements_and_caches_the_split_per_prompt(chat_server):
    url, calls = chat_server
    scene = shapes.Scene(
        (shapes.ShapeObject("circle", "red", 0), shapes.ShapeObject("square", "blue", 8))
    )
    image = shapes.render(scene, 64, 64)[None]
    client = OpenAICompatibleClient(url)
    reward = RubricReward(client, client)
    prompt_ok, prompt_half = "a red circle and a blue square", "a red circle and a green triangle"
    out = reward(np.concatenate([image, image, image]), [prompt_ok, prompt_half, prompt_ok])
    np.testing.assert_allclose(out.scores, [1.0, 0.5, 1.0])
    np.testing.assert_array_equal(out.sub_scores["requirements"], [2, 2, 2])
    np.testing.assert_array_equal(out.sub_scores["unclear"], [0, 0, 0])
    assert calls["split"] == 2 and reward.llm_calls == 2  # two distinct prompts, one call each
    reward(image, [prompt_ok])
    assert calls["split"] == 2  # cached
    assert calls["check"] == 8


def test_a_down_chat_server_is_a_clear_connection_error():
    client = OpenAICompatibleClient("http://127.0.0.1:9", retries=1)
    with pytest.raises(ConnectionError, match="did not answer after 2 attempts"):
        client.chat([{"role": "user", "content": "hi"}])


def test_score_command_reads_sidecar_prompts_and_writes_jsonl(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "renders"
    folder.mkdir()
    scenes = [shapes.sample_scene(rng) for _ in range(3)]
    for i, scene in enumerate(scenes):
        Image.fromarray(shapes.render(scene, 48, 48)).save(folder / f"{i}.png")
        prompt = shapes.captions(scene)["short"]
        if i == 0:
            (folder / f"{i}.txt").write_text(prompt)
        else:
            (folder / f"{i}.json").write_text(json.dumps({"prompt": prompt}))
    out = tmp_path / "scores.jsonl"
    assert (
        run_cli(_standalone(), ["score", str(folder), "--kind", "rubric", "--out", str(out)]) == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["image"] for r in rows] == ["0.png", "1.png", "2.png"]
    images = np.stack([np.asarray(Image.open(folder / f"{i}.png")) for i in range(3)])
    expected = ShapesRubricReward()(images, [r["prompt"] for r in rows]).scores
    np.testing.assert_array_equal([r["score"] for r in rows], expected)


def test_commands_report_user_mistakes_in_one_line(tmp_path, capsys):
    assert run_cli(_standalone(), ["serve-reward", "--kind", "nope"]) == 2
    assert "unknown reward 'nope'" in capsys.readouterr().err
    assert run_cli(_standalone(), ["serve-reward", "--kind", "artifact:missing.npz"]) == 2
    assert "no artifact head at missing.npz" in capsys.readouterr().err
    assert run_cli(_standalone(), ["serve-reward", "--kind", "rubric", "--host", "0.0.0.0"]) == 2
    assert "give a token" in capsys.readouterr().err
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    assert run_cli(_standalone(), ["score", str(tmp_path), "--kind", "rubric"]) == 2
    assert "no prompt for 1 images" in capsys.readouterr().err
