"""`krea2 dit serve` with dynamic batching against one image at a time, on a tiny model (CPU).

Two servers run side by side on the same random tiny model folder
(``krea2.dit.testing.write_tiny_model_folder``): one batching (``--max-batch``,
``--batch-wait-ms``) and one sampling one image per call (``--max-batch 1``). For each,
``--clients`` concurrent clients (threads, one HTTP connection each) send ``--requests``
requests one after another (one image each, every request its own prompt and seed, the
same shape); images/s over the run and per-request latency p50/p99. The two alternate for
``--rounds`` rounds (which goes first alternates too), so changing load on a shared machine
hits both alike; the throughput ratio is the median of the rounds' ratios, latencies are
pooled over rounds. Target (issue #43): ratio >= 1.6 at 4 clients.

    uv run --frozen python -m benchmarks.serve_images [--clients 4] [--requests 24] [--rounds 3]

Writes benchmarks/results/serve_images.json and the ``serve_images`` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.report import table, write_results

TARGET = 1.6
KREA2 = str(Path(sys.executable).parent / "krea2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder: Path, args: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    """`krea2 dit serve` on ``folder`` with ``args``, ready; (process, URL)."""
    port = _free_port()
    cmd = [KREA2, "dit", "serve", "--model", str(folder), "--port", str(port), "--size",
           "32x32", "--text-tokens", "16", "--device", "cpu", *args]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).json()["ready"]:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd)} did not become ready")


def drive(url: str, clients: int, requests: int, steps: int, offset: int) -> dict:
    """``clients`` threads each send ``requests`` one-image requests in turn: images/s,
    latencies (s), and the server's batches over the run."""
    pool = [httpx.Client(base_url=url, timeout=300) for _ in range(clients)]
    for client in pool:  # warm-up: connection open, server warm
        client.post("/v1/images/generations", json={"prompt": "warm", "steps": steps})
    latencies: list[float] = []
    errors: list[str] = []

    def run(k: int) -> None:
        for i in range(requests):
            body = {"prompt": f"a red circle number {k} {i}", "steps": steps,
                    "seed": offset + k * requests + i}  # fmt: skip
            t = time.perf_counter()
            r = pool[k].post("/v1/images/generations", json=body)
            latencies.append(time.perf_counter() - t)
            if r.status_code != 200:
                errors.append(f"{r.status_code} {r.text[:200]}")

    batches0 = httpx.get(url + "/health").json()["batches"]
    workers = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    batches = httpx.get(url + "/health").json()["batches"] - batches0
    for client in pool:
        client.close()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, e.g. {errors[0]}")
    return {"images_per_s": clients * requests / wall, "latencies": latencies,
            "images_per_batch": clients * requests / max(batches, 1)}  # fmt: skip


def measure(args: argparse.Namespace) -> dict:
    from krea2.dit.testing import write_tiny_model_folder

    modes = {
        "batched": ["--max-batch", str(args.max_batch), "--batch-wait-ms", str(args.wait_ms)],
        "one_at_a_time": ["--max-batch", "1"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_tiny_model_folder(Path(tmp) / "tiny")
        servers = {m: start_server(folder, a, args.threads) for m, a in modes.items()}
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        try:
            for r in range(args.rounds):
                order = list(modes) if r % 2 == 0 else list(reversed(modes))
                for m in order:
                    runs[m].append(drive(servers[m][1], args.clients, args.requests, args.steps,
                                         offset=r * 10_000))  # fmt: skip
                    print(f"round {r}: {m} {runs[m][-1]['images_per_s']:.1f} images/s",
                          file=sys.stderr)  # fmt: skip
        finally:
            for proc, _ in servers.values():
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    out: dict = {"clients": args.clients, "requests_per_client": args.requests,
                 "rounds": args.rounds, "steps": args.steps, "size": "32x32",
                 "max_batch": args.max_batch, "batch_wait_ms": args.wait_ms,
                 "threads": args.threads}  # fmt: skip
    for m, rs in runs.items():
        lat = np.asarray([x for run in rs for x in run["latencies"]]) * 1000
        out[m] = {
            "images_per_s": statistics.median(run["images_per_s"] for run in rs),
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)),
            "images_per_batch": statistics.median(run["images_per_batch"] for run in rs),
        }
    ratios = [b["images_per_s"] / o["images_per_s"]
              for b, o in zip(runs["batched"], runs["one_at_a_time"], strict=True)]  # fmt: skip
    out["throughput_ratio"] = statistics.median(ratios)
    out["round_ratios"] = ratios
    return out


def markdown(res: dict, command: str) -> str:
    rows = [
        [name, f"{res[key]['images_per_s']:.1f}", f"{res[key]['p50_ms']:.0f}",
         f"{res[key]['p99_ms']:.0f}", f"{res[key]['images_per_batch']:.2f}"]
        for key, name in (("batched", f"batched (max {res['max_batch']}, wait "
                                      f"{res['batch_wait_ms']:g} ms)"),
                          ("one_at_a_time", "one at a time (`--max-batch 1`)"))
    ]  # fmt: skip
    verdict = "meets" if res["throughput_ratio"] >= TARGET else "misses"
    return (
        "## Image server: dynamic batching (`benchmarks/serve_images.py`)\n\n"
        f"`krea2 dit serve` on the random tiny model folder ({res['size']}, {res['steps']} "
        f"steps, CFG 4.5, {res['threads']} thread(s) per server), {res['clients']} concurrent "
        f"clients sending {res['requests_per_client']} one-image requests each, "
        f"{res['rounds']} alternating rounds: batching gives "
        f"**{res['throughput_ratio']:.2f}x** the throughput of one image per call "
        f"({verdict} the ≥ {TARGET}x target).\n\n"
        + table(["server", "images/s", "p50 ms", "p99 ms", "images per batch"], rows)
        + f"\n\n`{command}`"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=24, help="per client and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--wait-ms", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per server")
    args = ap.parse_args()
    res = measure(args)
    command = "uv run --frozen python -m benchmarks.serve_images " + " ".join(sys.argv[1:])
    print(markdown(res, command.strip()))
    write_results("serve_images", res, markdown(res, command.strip()))


if __name__ == "__main__":
    main()
