"""Quantized weights of a demo's raw model: ShapesEval, block bytes and time per image for
full precision, torchao int8 and (on a CUDA GPU with compute capability 8.9+) float8, and
GGUF Q8_0 and Q4_1 read back dequantized.

The chain's final model (``raw``) of a finished full demo (``--demo DIR``) is loaded as the
demo loads it, its block Linears quantized with :func:`krea2.dit.weight_quant.
quantize_block_linears` (torchao weight-only; what `krea2 dit sample|serve --quant` do),
the GGUF files written by :func:`krea2.dit.gguf_weights.save_gguf` (`krea2 dit convert --to
gguf`) and loaded back dequantized to fp32 (their bytes: the file's), each sampled on the
held-out prompts x ``[eval]``'s seeds at ``[eval]``'s steps the way the
chain measures raw: without CFG. Each mode's ShapesEval is paired with full precision's on
the same prompts and seeds (± its standard error over the prompts); ``pixel_diff`` is the
mean absolute difference of the images from full precision's (of 255 levels). Target
(issue #43): int8 and GGUF Q8_0 within 0.02 of full precision. Modes alternate over ``--rounds`` for
the timing (the machine's load hits all alike); the images are the first round's.

    uv run --frozen python -m benchmarks.quant_sampling --demo DIR [--rounds 2]

Writes benchmarks/results/quant_sampling.json and the ``quant_sampling`` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.report import table, write_results

TARGET = 0.02
GGUF = ("Q8_0", "Q4_1")


def modes() -> list[str]:
    from krea2.dit.weight_quant import float8_supported

    cuda = torch.cuda.is_available() and float8_supported("cuda")
    return ["none", "int8", "float8"] if cuda else ["none", "int8"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", type=Path, required=True, help="a finished full demo's --out")
    ap.add_argument("--rounds", type=int, default=2, help="timing rounds per mode")
    args = ap.parse_args()
    from krea2.curate.shapes import concept_scene, eval_prompt, shapes_eval
    from krea2.dit.gguf_weights import read_gguf, save_gguf
    from krea2.dit.weight_quant import quantize_block_linears, stored_bytes
    from krea2.pipeline.chain import load_model
    from krea2.pipeline.config import load_demo_config
    from krea2.pipeline.evaluation import demo_concepts, paired_delta
    from krea2.trainer import load_stage_module, sample_module

    demo, cfg = args.demo.resolve(), load_demo_config(False, None, [])
    _, held = demo_concepts(cfg)
    prompts, targets = [eval_prompt(c) for c in held], [concept_scene(c) for c in held]
    chain = json.loads((demo / "stages" / "chain.json").read_text())["result"]["models"]["raw"]
    job, index = load_model(chain["record"])
    seeds, steps = list(cfg.eval.seeds), cfg.eval.steps
    loaded, file_bytes = {}, {}
    for mode in modes():
        module = load_stage_module(job, index)
        device = next(module.parameters()).device
        # a module still holding LoRA wrappers keeps its adapters' own Linears as they are
        quantize_block_linears(module.dit, mode, device, lambda m, n: ".lora_" not in n)
        loaded[mode] = module
    work = demo / "quant-sampling"
    state = {k: v.detach().cpu() for k, v in loaded["none"].dit.state_dict().items()}
    for qtype in GGUF:
        path = save_gguf(state, work / f"raw-{qtype}.gguf", qtype, loaded["none"].dit.cfg)
        module = load_stage_module(job, index)
        module.dit.load_state_dict(read_gguf(path)[0])
        loaded[f"gguf {qtype}"], file_bytes[f"gguf {qtype}"] = module, path.stat().st_size
    images, seconds = {}, {m: [] for m in loaded}
    for r in range(args.rounds):
        for mode in loaded if r % 2 == 0 else reversed(list(loaded)):
            t = time.perf_counter()
            out = sample_module(job, index, loaded[mode], prompts, seeds, steps, 0.0)
            seconds[mode].append((time.perf_counter() - t) / out[:, :, 0, 0, 0].size)
            images.setdefault(mode, out)
    base = shapes_eval(images["none"], targets)
    rows = {}
    for mode, imgs in images.items():
        scored = shapes_eval(imgs, targets)
        rows[mode] = {
            "shapes_eval": scored.score,
            "all_correct": scored.all_correct,
            "delta": paired_delta(scored.per_image, base.per_image),
            "pixel_diff": float(np.abs(imgs.astype(int) - images["none"].astype(int)).mean()),
            "block_bytes": stored_bytes(loaded[mode].dit, "blocks."),
            "file_bytes": file_bytes.get(mode),
            "seconds_per_image": float(np.median(seconds[mode])),
        }
    full, whole = rows["none"]["block_bytes"], stored_bytes(loaded["none"].dit)
    for row in rows.values():  # a GGUF's ratio: its file against the fp32 weights
        row["bytes_ratio"] = (row["block_bytes"] / full if row["file_bytes"] is None
                              else row["file_bytes"] / whole)  # fmt: skip
    within = {m: abs(rows[m]["delta"]["delta"]) <= TARGET for m in ("int8", "gguf Q8_0")}
    res = {
        "model": chain["record"],
        "prompts": len(prompts),
        "seeds": seeds,
        "steps": steps,
        "device": str(next(loaded["none"].parameters()).device),
        "modes": rows,
        "target": TARGET,
        "within_target": within,
    }
    write_results("quant_sampling", res, markdown(res))
    print(json.dumps(rows, indent=1))


def markdown(res: dict) -> str:
    rows = []
    for mode, r in res["modes"].items():
        d = r["delta"]
        delta = "" if mode == "none" else f" ({d['delta']:+.3f} ± {d['se']:.3f})"
        rows.append([mode, f"{r['shapes_eval']:.3f}{delta}", f"{r['all_correct']:.3f}",
                     f"{r['pixel_diff']:.2f}", f"{r['bytes_ratio']:.3f}",
                     f"{1000 * r['seconds_per_image']:.1f}"])  # fmt: skip
    verdict = ", ".join(f"{m} {'holds' if ok else 'does not hold'}"
                        for m, ok in res["within_target"].items())  # fmt: skip
    return (
        "## Quantized sampling (`quant_sampling`)\n\n"
        f"The demo's raw model sampled with its block Linears as stored: {res['prompts']} "
        f"held-out prompts x {len(res['seeds'])} seeds, {res['steps']} steps without CFG (as "
        f"the chain measures raw), on {res['device']}. ShapesEval paired with full precision "
        "(± s.e. over the prompts); pixel diff: mean |difference| from full precision's "
        "images (of 255); bytes: the blocks' stored bytes over full precision's (a GGUF: "
        "its file over the fp32 weights; sampled dequantized to fp32, so its time is fp32's). "
        f"Target (issue #43): within {res['target']} of full precision: {verdict}.\n\n"
    ) + table(HEADERS, rows)


HEADERS = ["weights", "ShapesEval", "all correct", "pixel diff", "bytes", "ms / image"]


if __name__ == "__main__":
    main()
