"""Prompt rows for the trainer's loader: an RL stage's "data" is its prompt pool.

The trainer iterates shards (contract 2); an RL stage's shards hold one row per prompt,
its ``medium`` caption the prompt. The loader needs an image per row, so each row carries
a flat grey image of the stage's side, marked ``{"role": "prompt"}`` in its metadata; the
RL objective reads only the caption (and the side, to size its rollouts).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from pathlib import Path

from krea2.infra.errors import UserError
from krea2.infra.shards import bucket_name, write_shard


def _grey_png(side: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side), (128, 128, 128)).save(buf, format="PNG")
    return buf.getvalue()


def export_prompt_shards(
    prompts: Sequence[str], out: Path, side: int, batch_size: int, seed: int = 0
) -> list[Path]:
    """Write ``prompts`` (non-empty strings) as one prompt shard under ``out`` for a stage
    of ``side`` px and ``batch_size`` prompts per step; returns the files. UserError on an
    empty pool or an empty prompt."""
    if not prompts:
        raise UserError("the prompt pool is empty; give at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise UserError(f"prompt {i} is empty; every prompt must be a non-empty string")
    image = _grey_png(side)
    bucket = bucket_name(side, side)
    rows = [
        {
            "key": f"prompt-{i:06d}",
            "image": image,
            "uri": None,
            "crop": None,
            "width": side,
            "height": side,
            "bucket": bucket,
            "captions": [{"format": "medium", "text": p}],
            "meta": json.dumps({"role": "prompt", "index": i}),
        }
        for i, p in enumerate(prompts)
    ]
    digest = hashlib.sha1("\n".join(prompts).encode()).hexdigest()[:8]
    path = Path(out) / f"prompts-{digest}.parquet"
    write_shard(rows, path, stage="rl", seed=seed, batch_size=batch_size)
    return [path]


def batch_prompts(batch: dict, step: int) -> list[str]:
    """The prompts of a batch of prompt rows; UserError when a row is not a prompt row
    (an RL stage pointed at image shards)."""
    out = []
    for key, meta, caps in zip(batch["keys"], batch["meta"], batch["captions"], strict=True):
        if meta.get("role") != "prompt" or not caps:
            raise UserError(
                f"step {step}: row {key!r} is not a prompt row; an RL stage trains on prompt "
                "shards (krea2.rl.online.export_prompt_shards)"
            )
        out.append(caps[0]["text"])
    return out
