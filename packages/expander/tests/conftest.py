"""A small OpenAI-compatible chat server on loopback, scripted per test; a perfect
ShapesWorld text-to-image renderer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from krea2.curate import shapes

Answer = Callable[[list[dict]], str]


@contextmanager
def on_loopback(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free loopback port; yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def serve() -> Callable[[FastAPI], AbstractContextManager[str]]:
    """`on_loopback`, for tests that serve an app of their own."""
    return on_loopback


class ChatServer:
    """Serves ``/v1/chat/completions``; ``answer(messages)`` gives each reply's text."""

    def __init__(self) -> None:
        self.answer: Answer = lambda messages: ""
        self.calls = 0
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        def complete(body: dict) -> dict:
            self.calls += 1
            text = self.answer(body["messages"])
            return {"choices": [{"message": {"role": "assistant", "content": text}}]}


@pytest.fixture(scope="module")
def chat_server() -> Iterator[tuple[ChatServer, str]]:
    server = ChatServer()
    with on_loopback(server.app) as url:
        yield server, url


def scene_renderer(prompts: list[str]) -> np.ndarray:
    """A perfect text-to-image model of ShapesWorld: draws exactly the shapes a prompt
    places (unplaced ones in free cells), so image rewards depend on the text alone."""
    images = []
    for prompt in prompts:
        reqs = shapes.parse_prompt(prompt)
        placed = {(r.color, r.shape): r.cell for r in reqs if r.kind == "position"}
        kinds = list(dict.fromkeys((r.color, r.shape) for r in reqs if r.kind == "object"))
        free = [c for c in range(9) if c not in placed.values()]
        objects = [
            shapes.ShapeObject(s, c, placed.get((c, s), free.pop(0) if (c, s) not in placed else 0))
            for c, s in kinds
        ]
        images.append(shapes.render(shapes.Scene(tuple(objects)), 64, 64))
    return np.stack(images)


@pytest.fixture
def perfect_renderer() -> Callable[[list[str]], np.ndarray]:
    return scene_renderer
