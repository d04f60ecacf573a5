"""Helpers the dit tests share (importable under pytest's importlib mode: conftest puts this
folder on sys.path)."""

from __future__ import annotations

import threading

import httpx

GEN = "/v1/images/generations"


def send(url: str, results: dict, key: str, body: dict, timeout: float = 120) -> threading.Thread:
    """POST ``body`` to ``url``'s generations endpoint on a thread; the response (or the
    exception) lands in ``results[key]``."""

    def run() -> None:
        try:
            results[key] = httpx.post(url + GEN, json=body, timeout=timeout)
        except httpx.HTTPError as e:
            results[key] = e

    thread = threading.Thread(target=run)
    thread.start()
    return thread
