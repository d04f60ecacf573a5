"""Classifier distillation and SAE tagging on toy-encoder embeddings of a ShapesWorld pool.

A deterministic "VLM" is served behind the OpenAI chat API on loopback: it answers the task
question ("Is there a triangle in this image?") by looking at the pixels with ShapesWorld's
object detector (``shapes.detect_objects``), and returns garbage to every ``--garbage-every``
-th request, so the client's re-asking is exercised for real. Its pseudo-labels train a
logistic head on the frozen toy-encoder embeddings (60% train, 20% Platt calibration, 20%
held out); precision/recall are on the held-out pseudo-labels, and also against the
generator's ground truth (the scene specs), with the VLM's own accuracy beside them. A
top-k SAE is trained on the same embeddings: FVU, dead features, L0.

Needs a toy encoder trained on the same pool (seed and size as ``curate_semdedup``'s
default, whose clean scenes these are): ``uv run python -m benchmarks.curate_semdedup
--save-encoder /tmp/enc`` then ``uv run python -m benchmarks.curate_distill --encoder
/tmp/enc``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.report import table, write_results

# Tasks the loopback "VLM" answers from the pixels: (question, check on detected objects and
# pixels, ground truth from the scene spec).
TASKS = {
    "triangle": (
        "Is there a triangle in this image?",
        lambda objs, px: any(o.shape == "triangle" for o in objs),
        lambda scene: any(o.shape == "triangle" for o in scene.objects),
    ),
    "blue": (
        "Is there a blue shape in this image?",
        lambda objs, px: any(o.color == "blue" for o in objs),
        lambda scene: any(o.color == "blue" for o in scene.objects),
    ),
    "word": (
        "Is there a written word in this image?",
        lambda objs, px: int((px.min(axis=2) > 235).sum()) > 30,
        lambda scene: scene.word is not None,
    ),
}


class Oracle(BaseHTTPRequestHandler):
    """Answers each task's question by looking at the pixels (``TASKS``)."""

    garbage_every = 0
    count = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        from krea2.curate.shapes import detect_objects

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        parts = body["messages"][-1]["content"]
        url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))
        with self.lock:
            Oracle.count += 1
            garbage = self.garbage_every and Oracle.count % self.garbage_every == 0
        question = next(p["text"] for p in parts if p["type"] == "text")
        check = next(c for q, c, _ in TASKS.values() if question.startswith(q))
        found = check(detect_objects(pixels), pixels)
        answer = "a nice picture" if garbage else json.dumps({"label": "yes" if found else "no"})
        data = json.dumps({"choices": [{"message": {"content": answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def markdown(r: dict) -> str:
    rows = []
    for name, t in r["tasks"].items():
        h, ht, v = t["head"], t["head_vs_truth"], t["vlm_vs_truth"]
        rows.append(
            [
                f"{name}: {TASKS[name][0]}",
                f"{h['held_out_positives']}/{h['held_out']}",
                f"{h['precision']:.3f}",
                f"{h['recall']:.3f}",
                f"{ht['precision']:.3f}",
                f"{ht['recall']:.3f}",
                f"{h['ece_uncalibrated']:.3f} → {h['ece']:.3f}",
                f"{v['f1']:.3f}",
            ]
        )
    s = r["sae"]
    return (
        "## Curate: classifier distillation and SAE on toy embeddings "
        "(`benchmarks/curate_distill.py`)\n\n"
        f"{r['images']} ShapesWorld scenes (the pool the toy encoder was trained on). Each "
        "question is asked through the OpenAI chat API of a loopback server that answers "
        f"from the pixels (shape detector, white text pixels); every {r['garbage_every']}th "
        f"answer is garbage and is asked again ({r['requests']} requests in all). A "
        f"logistic head on the frozen {r['dim']}-d toy-encoder embeddings: 60% train, 20% "
        "Platt calibration, 20% held out; precision/recall on the held-out pseudo-labels "
        "and against the generator's truth; ECE before → after calibration; the VLM's own "
        "F1 against the truth. The toy encoder was trained for copy detection on 452 images, "
        "not for semantics: it carries colour (the blue task) far better than shape classes "
        "or a small white word, and a head can only distill what the embedding holds.\n\n"
        + table(
            [
                "task",
                "held-out positives",
                "precision",
                "recall",
                "precision (truth)",
                "recall (truth)",
                "ECE",
                "VLM F1",
            ],
            rows,
        )
        + f"\n\nTop-k SAE ({s['features']} features, k = {s['k']}, {s['steps']} steps, "
        f"{s['seconds']:.0f} s): FVU {s['fvu']:.3f}, L0 {s['l0']:.0f}, dead features "
        f"{s['dead_features']} ({s['dead_share']:.1%}), most frequent feature on "
        f"{s['max_frequency']:.1%} of images."
    )


def main() -> None:
    from krea2.curate.distill import LabelTask, pseudo_label, scores, split_indices, train_head
    from krea2.curate.embed import load_embedder
    from krea2.curate.embed.sae import SaeConfig, train_sae
    from krea2.curate.shapes import make_pool
    from krea2.curate.vlm import VlmClient

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--clean", type=int, default=400)
    ap.add_argument("--garbage-every", type=int, default=7)
    ap.add_argument("--sae-steps", type=int, default=2000)
    ap.add_argument("--report-only", type=Path)
    args = ap.parse_args()
    if args.report_only:
        results = json.loads(args.report_only.read_text())
        write_results("curate_distill", results, markdown(results))
        return
    pool = make_pool(
        seed=args.seed, n_clean=args.clean, n_per_defect=0, n_overrepresented=0, classes=()
    )
    images = [np.asarray(Image.open(io.BytesIO(it.data)).convert("RGB")) for it in pool]

    Oracle.garbage_every = args.garbage_every
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Oracle)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    client = VlmClient(f"http://127.0.0.1:{httpd.server_address[1]}", concurrency=4)
    x = load_embedder(f"toy:{args.encoder}").embed(images).astype(np.float32)
    held = split_indices(len(images))[2]  # train_head's held-out rows
    results: dict = {
        "images": len(images),
        "dim": x.shape[1],
        "garbage_every": args.garbage_every,
        "tasks": {},
    }
    for name, (question, _, truth_of) in TASKS.items():
        truth = np.asarray([truth_of(it.scene) for it in pool], float)
        start = time.perf_counter()
        labels = pseudo_label(client, images, LabelTask(name, question), garbage_retries=3)
        label_s = time.perf_counter() - start
        failed = [e for e in labels if isinstance(e, Exception)]
        if failed:
            raise SystemExit(f"{name}: {len(failed)} labels failed: {failed[:3]}")
        y = np.asarray([label == "yes" for label in labels], float)
        head, report = train_head(name, x, y)
        results["tasks"][name] = {
            "label_s": label_s,
            "vlm_vs_truth": scores(y, truth),
            "head": report,
            "head_vs_truth": scores(head.proba(x[held]), truth[held]),
        }
        print(name, json.dumps(results["tasks"][name]), flush=True)
    httpd.shutdown()
    results["requests"] = Oracle.count
    cfg = SaeConfig(features=256, k=8, steps=args.sae_steps)
    _, sae = train_sae(x, cfg)
    results["sae"] = sae | {"features": cfg.features, "k": cfg.k, "steps": cfg.steps}
    print(json.dumps(results, indent=1))
    write_results("curate_distill", results, markdown(results))


if __name__ == "__main__":
    main()
