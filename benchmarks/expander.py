"""Expander serving: throughput and latency of `krea2 expander serve` (the OpenAI-compatible
HTTP server, on loopback, with C concurrent clients) against calling the same model
in-process, on the same requests.

    uv run python -m benchmarks.expander [--model DIR] [--requests 64] [--clients 4]

Without ``--model`` a toy expander is built (a tiny Qwen3 + tokenizer trained on ShapesWorld
chats, untrained weights: generation cost does not depend on what the weights say; the
generated length is fixed by ``--max-tokens``, and the model never stops early because
its end-of-turn token is masked out). Requests are ShapesWorld user requests
(`krea2.expander.user_prompts`). Writes benchmarks/results/expander.json and the
``expander`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.report import table, write_results


def toy_model(folder: Path) -> Path:
    from krea2.curate import shapes
    from krea2.expander.sft_data import shapes_sft_examples
    from krea2.expander.toy_model import tiny_qwen3, train_tokenizer

    rng = np.random.default_rng(0)
    chats = shapes_sft_examples([shapes.sample_scene(rng) for _ in range(200)])
    tok = train_tokenizer([m["content"] for c in chats for m in c["messages"]])
    tiny_qwen3(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def requests(n: int) -> list[str]:
    from krea2.curate import shapes
    from krea2.expander.user_prompts import user_prompt

    rng = np.random.default_rng(1)
    return [user_prompt(shapes.sample_scene(rng, word_prob=0.3), rng).text for _ in range(n)]


def percentile_ms(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.array(values) * 1000, q)), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    import httpx
    import torch
    import uvicorn

    from krea2.expander.server import Expander, create_app
    from krea2.expander.toy_model import load_model

    torch.set_num_threads(2)
    folder = args.model or toy_model(Path(tempfile.mkdtemp(prefix="expander-bench-")))
    model, tok = load_model(folder)
    # a fixed generated length: no early stop
    model.generation_config.suppress_tokens = [tok.eos_token_id]
    expander = Expander(model, tok, max_new_tokens=args.max_tokens)
    prompts = requests(args.requests)

    expander.expand(prompts[:1])  # warm-up
    latencies: list[float] = []

    def in_process_round() -> float:
        t0 = time.perf_counter()
        for p in prompts:
            t = time.perf_counter()
            expander.expand([p])
            latencies.append(time.perf_counter() - t)
        return time.perf_counter() - t0

    # In-process before and after the served round, averaged: a shared machine's load
    # drifts, and the two paths must see the same drift.
    in_process = in_process_round()
    app = create_app(expander, "bench")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    client = httpx.Client(timeout=300)
    http_latencies: list[float] = []

    def call(p: str) -> None:
        t = time.perf_counter()
        body = {"messages": [{"role": "user", "content": p}], "max_tokens": args.max_tokens}
        r = client.post(f"{url}/v1/chat/completions", json=body)
        r.raise_for_status()
        http_latencies.append(time.perf_counter() - t)

    call(prompts[0])  # warm-up
    http_latencies.clear()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(call, prompts))
    served = time.perf_counter() - t0
    server.should_exit = True
    thread.join(10)
    in_process = (in_process + in_process_round()) / 2

    rows = [
        ["in-process", round(len(prompts) / in_process, 2), percentile_ms(latencies, 50),
         percentile_ms(latencies, 99)],
        [f"serve (HTTP, {args.clients} clients)", round(len(prompts) / served, 2),
         percentile_ms(http_latencies, 50), percentile_ms(http_latencies, 99)],
    ]  # fmt: skip
    results = {
        "requests": len(prompts),
        "max_tokens": args.max_tokens,
        "model": str(args.model) if args.model else "toy (tiny Qwen3, 4 x 128)",
        "in_process_rps": rows[0][1],
        "served_rps": rows[1][1],
        "served_over_in_process": round(rows[1][1] / rows[0][1], 3),
    }
    markdown = (
        "### expander serving\n\n"
        f"{len(prompts)} ShapesWorld requests, {args.max_tokens} generated tokens each, "
        f"model: {results['model']}; the server answers one request at a time (a lock "
        "around generation), so HTTP costs what its overhead costs.\n\n"
        + table(["path", "requests/s", "p50 ms", "p99 ms"], rows)
        + f"\n\nserve / in-process throughput: {results['served_over_in_process']}"
    )
    write_results("expander", results, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
