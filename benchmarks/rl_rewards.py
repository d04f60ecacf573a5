"""Reward throughput in-process and over HTTP (loopback), per kind, plus a kill/restart run.

For each reward kind: images/s and per-call latency (p50/p99) of the reward called in-process
on batches of ``--batch`` images, against a reward server (``ServerThread``, max batch =
``--batch``) fed by ``--clients`` concurrent ``RewardClient`` threads sending requests of
``--batch`` images; the two alternate for ``--rounds`` rounds and medians are kept (the ratio
is the median of the rounds' ratios), so changing load on a shared machine hits both alike.
Then a fault run: a served reward (subprocess) is SIGKILLed and restarted mid-run while a
client scores one request after another; every request must be answered once, with the
in-process scores. ``benchmarks/rl.py`` reuses the throughput part (``reward_kinds``,
``throughput``).

    uv run --frozen python -m benchmarks.rl_rewards [--quick] [--rounds 3]

Writes benchmarks/results/rl_rewards.json and the ``rl_rewards`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.report import table, write_results
from krea2.curate import shapes
from krea2.rl.rewards import (
    RewardClient,
    RewardOutput,
    ServerConfig,
    ServerThread,
    ShapesRubricReward,
    TextRenderingReward,
    evaluate_artifact_reward,
    render_defects,
    train_aesthetic_reward,
    train_artifact_reward,
)


def _batch(n: int, seed: int, size: int = 64):
    rng = np.random.default_rng(seed)
    scenes = [shapes.sample_scene(rng) for _ in range(n)]
    return np.stack([shapes.render(s, size, size) for s in scenes]), [
        shapes.captions(s)["medium"] for s in scenes
    ]


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000, q))


def in_process(reward, images, prompts, batch: int, calls: int) -> dict:
    reward(images[:batch], prompts[:batch])  # warm-up (OCR engine, caches)
    lat = []
    t0 = time.perf_counter()
    for i in range(calls):
        s = (i * batch) % (len(prompts) - batch + 1)
        t = time.perf_counter()
        reward(images[s : s + batch], prompts[s : s + batch])
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    return {"images_per_s": calls * batch / wall, "p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99)}


def drive(
    url: str, token: str, images, prompts, batch: int, calls: int, clients: int, **client_kw
) -> dict:
    """``clients`` concurrent ``RewardClient(url, token, **client_kw)`` threads send ``calls``
    requests of ``batch`` images in all to the reward server at ``url``: images/s and
    per-request latency. The clients are built and connected (one warm-up request each)
    before the clock starts: an httpx client takes ~20 ms to build (its TLS context); four of
    them would count against HTTP as ~8% of a one-second run."""
    lat: list[float] = []
    pool = [RewardClient(url, token, **client_kw) for _ in range(clients)]
    for client in pool:
        client(images[:batch], prompts[:batch])  # warm-up: connection open, server warm

    def run(k: int) -> None:
        for i in range(k, calls, clients):
            s = (i * batch) % (len(prompts) - batch + 1)
            t = time.perf_counter()
            pool[k](images[s : s + batch], prompts[s : s + batch])
            lat.append(time.perf_counter() - t)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    t0, c0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    for client in pool:
        client.close()
    return {
        "images_per_s": calls * batch / wall,
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
        "cpu_s": cpu,  # this process's: the clients, and the server when it runs here
    }


def over_http(reward, images, prompts, batch: int, calls: int, clients: int, **client_kw) -> dict:
    """:func:`drive` against ``reward`` served by a ``ServerThread`` in this process."""
    config = ServerConfig(max_batch=batch, max_wait_ms=5, token="bench")
    with ServerThread(reward, config=config) as server:
        return drive(server.url, "bench", images, prompts, batch, calls, clients, **client_kw)


def compare(
    reward, images, prompts, batch: int, calls: int, clients: int, rounds: int, url: str = ""
) -> dict:
    """``in_process`` and ``over_http`` alternately, ``rounds`` times each (which goes first
    alternates too): the medians of their fields, the ``ratio`` HTTP / in-process images/s
    as the median of the rounds' ratios, and every round. With ``url`` (a server already
    serving ``reward``, token ``bench``) the HTTP runs go there instead."""
    runs: list[dict] = []
    for r in range(rounds):
        order = ("in_process", "http") if r % 2 == 0 else ("http", "in_process")
        run = {}
        for where in order:
            if where == "in_process":
                run[where] = in_process(reward, images, prompts, batch, calls)
            elif url:
                run[where] = drive(url, "bench", images, prompts, batch, calls, clients)
            else:
                run[where] = over_http(reward, images, prompts, batch, calls, clients)
        run["ratio"] = run["http"]["images_per_s"] / run["in_process"]["images_per_s"]
        runs.append(run)
    med = {
        where: {k: float(np.median([r[where][k] for r in runs])) for k in runs[0][where]}
        for where in ("in_process", "http")
    }
    return {**med, "ratio": float(np.median([r["ratio"] for r in runs])), "rounds": runs}


def reward_kinds(quick: bool, prompts: list[str], tmp: Path) -> tuple[dict, object]:
    """The four reward kinds, ``name -> (reward, prompts)`` (the artifact and aesthetic heads
    trained here on ShapesWorld renders, the aesthetic one saved under ``tmp``), and the
    artifact head's detection check on held-out renders."""
    text_prompts = [p + ' with the word "KREA"' for p in prompts]
    artifact = train_artifact_reward(n=400 if quick else 1200, seed=0)
    detection = evaluate_artifact_reward(artifact, n=400, seed=1)
    clean = np.stack(render_defects(240, seed=2, sizes=(64,))[0][0::2])
    noisy = np.clip(clean + np.random.default_rng(2).normal(0, 20, clean.shape), 0, 255)
    aesthetic = train_aesthetic_reward(clean, noisy.astype(np.uint8), path=tmp / "a.npz")
    kinds = {
        "rubric-shapes": (ShapesRubricReward(), prompts),
        "text": (TextRenderingReward(), text_prompts),
        "artifact": (artifact, prompts),
        "aesthetic": (aesthetic, prompts),
    }
    return kinds, detection


THROUGHPUT_HEADERS = [
    "reward",
    "in-process img/s",
    "HTTP img/s",
    "HTTP / in-process",
    "in-process p50 / p99 ms",
    "HTTP p50 / p99 ms",
]


def throughput(
    kinds: dict, images, batch: int, calls: int, clients: int, rounds: int
) -> tuple[dict, list[list]]:
    """:func:`compare` for every kind (the OCR-bound ``text`` with a quarter of the calls):
    per-kind results and the table's rows (``THROUGHPUT_HEADERS``)."""
    results, rows = {}, []
    for name, (reward, ps) in kinds.items():
        n = max(2, calls // 4) if name == "text" else calls
        c = compare(reward, images, ps, batch, n, clients, rounds)
        a, b = c["in_process"], c["http"]
        results[name] = c
        rows.append(
            [
                name,
                f"{a['images_per_s']:.0f}",
                f"{b['images_per_s']:.0f}",
                f"{c['ratio']:.2f}",
                f"{a['p50_ms']:.0f} / {a['p99_ms']:.0f}",
                f"{b['p50_ms']:.0f} / {b['p99_ms']:.0f}",
            ]
        )
        print(rows[-1], flush=True)
    return results, rows


def fault_run(n_requests: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "krea2.rl.rewards.cli", "serve-reward", "--kind", "rubric"]
    env = {**os.environ, "KREA2_REWARD_TOKEN": "bench"}

    def start() -> subprocess.Popen:
        return subprocess.Popen([*cmd, "--port", str(port)], env=env, stderr=subprocess.DEVNULL)

    images, prompts = _batch(n_requests, seed=9)
    expected = ShapesRubricReward()(images, prompts)
    results: dict[int, RewardOutput] = {}
    client = RewardClient(f"http://127.0.0.1:{port}", "bench", retries=15, max_backoff_s=2.0)
    proc = start()

    def run() -> None:
        for i in range(n_requests):
            results[i] = client(images[i : i + 1], prompts[i : i + 1])

    worker = threading.Thread(target=run)
    worker.start()
    while len(results) < n_requests // 3:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = len(results)
    t_kill = time.perf_counter()
    proc = start()
    worker.join()
    proc.kill()
    proc.wait()
    got = RewardOutput.concat([results[i] for i in range(n_requests)])
    same = bool(np.array_equal(got.scores, expected.scores))
    return {
        "requests": n_requests,
        "answered": len(results),
        "lost": n_requests - len(results),
        "killed_after": killed_at,
        "attempts": client.attempts,
        "recovery_s": time.perf_counter() - t_kill,
        "same_scores": same,
    }


def throughput_note(batch: int, clients: int, rounds: int) -> str:
    return (
        f"Batches of {batch} images (64×64 ShapesWorld renders); HTTP: a loopback reward "
        f"server (max batch {batch}, max wait 5 ms, bearer token) in the same process, fed by "
        f"{clients} concurrent clients (`RewardClient`, binary body, built and connected "
        "before the clock starts) sending one batch per request. In-process and HTTP "
        f"runs alternate, {rounds} rounds per kind: medians, the ratio the median of the "
        "rounds' ratios. Latency is per call / request; over HTTP it includes waiting behind "
        "the other clients' batches (one reward worker)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per kind")
    args = parser.parse_args()
    calls = 8 if args.quick else 32
    images, prompts = _batch(256, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        kinds, detection = reward_kinds(args.quick, prompts, Path(tmp))
        per_kind, rows = throughput(kinds, images, args.batch, calls, args.clients, args.rounds)
    results = {"batch": args.batch, "clients": args.clients, "rounds": args.rounds}
    results["kinds"] = per_kind
    fault = fault_run(24 if args.quick else 60)
    results["fault"] = fault
    results["artifact_detection"] = detection.__dict__
    print(fault, detection, flush=True)
    md = [
        "## RL rewards (`benchmarks/rl_rewards.py`)",
        "",
        throughput_note(args.batch, args.clients, args.rounds),
        "",
        table(THROUGHPUT_HEADERS, rows),
        "",
        f"Kill/restart: {fault['requests']} requests one after another, the server SIGKILLed "
        f"after {fault['killed_after']} and restarted: {fault['answered']} answered, "
        f"{fault['lost']} lost, {fault['attempts']} HTTP attempts in all, recovered in "
        f"{fault['recovery_s']:.1f} s, scores equal to in-process: {fault['same_scores']}.",
        "",
        f"Artifact head on 400 held-out renders (half with noise, blur, broken shapes or "
        f"borders): AUC {detection.auc:.3f}, accuracy {detection.accuracy:.3f}, recall by "
        f"defect {', '.join(f'{k} {v:.2f}' for k, v in detection.recall_by_kind.items())}; "
        f"mean score clean {detection.clean_score:.3f} vs defective {detection.defect_score:.3f}.",
    ]
    write_results("rl_rewards", results, "\n".join(md))


if __name__ == "__main__":
    main()
