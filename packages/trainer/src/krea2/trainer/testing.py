"""Small synthetic training shards (coloured squares and discs on a 3x3 grid) for tests and
benchmarks, written with pyarrow to the ``krea2.infra.shards`` contract."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

COLORS = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 230),
    "yellow": (240, 220, 40),
}
SHAPES = ("square", "disc")
CELLS = (
    "top left",
    "top",
    "top right",
    "left",
    "center",
    "right",
    "bottom left",
    "bottom",
    "bottom right",
)


def draw(color: str, shape: str, cell: int, width: int, height: int) -> np.ndarray:
    """uint8 [H, W, 3]: one shape filling most of a grid cell, on black."""
    img = np.zeros((height, width, 3), dtype=np.uint8)
    cw, ch = width / 3, height / 3
    cx, cy = (cell % 3 + 0.5) * cw, (cell // 3 + 0.5) * ch
    r = 0.42 * min(cw, ch)
    yy, xx = np.mgrid[0:height, 0:width] + 0.5
    if shape == "square":
        inside = (np.abs(xx - cx) <= r) & (np.abs(yy - cy) <= r)
    else:
        inside = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    img[inside] = COLORS[color]
    return img


def scene_captions(color: str, shape: str, cell: int) -> list[dict]:
    where = CELLS[cell]
    spec = {"objects": [{"color": color, "shape": shape, "cell": cell}]}
    return [
        {"format": "long", "text": f"a {color} {shape} in the {where} of a black background"},
        {"format": "medium", "text": f"a {color} {shape} in the {where}"},
        {"format": "short", "text": f"{color} {shape}"},
        {"format": "tags", "text": f"{color}, {shape}, {where}"},
        {"format": "json", "text": json.dumps(spec)},
    ]


def png_bytes(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def write_shard(path: Path, rows: list[dict], stage: str, seed: int, batch_size: int) -> Path:
    """Write rows (dicts with the contract's columns) as one Parquet shard with metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from krea2.infra.shards import (
        METADATA_BATCH_SIZE,
        METADATA_SEED,
        METADATA_STAGE,
        shard_arrow_schema,
        validate_shard_table,
    )

    schema = shard_arrow_schema().with_metadata(
        {
            METADATA_STAGE: stage.encode(),
            METADATA_SEED: str(seed).encode(),
            METADATA_BATCH_SIZE: str(batch_size).encode(),
        }
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    validate_shard_table(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=max(batch_size, 64))
    return path


def toy_rows(n: int, width: int, height: int, seed: int, prefix: str = "s") -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        color = list(COLORS)[rng.integers(len(COLORS))]
        shape = SHAPES[rng.integers(len(SHAPES))]
        cell = int(rng.integers(9))
        rows.append(
            {
                "key": f"{prefix}{seed}-{i:06d}",
                "image": png_bytes(draw(color, shape, cell, width, height)),
                "uri": None,
                "crop": None,
                "width": width,
                "height": height,
                "bucket": f"{width}x{height}",
                "captions": scene_captions(color, shape, cell),
                "meta": json.dumps({"color": color, "shape": shape, "cell": cell}),
            }
        )
    return rows


def write_toy_shards(
    directory: Path,
    n: int,
    size: tuple[int, int] = (32, 32),
    files: int = 2,
    batch_size: int = 8,
    seed: int = 0,
    stage: str = "toy",
) -> list[Path]:
    """``n`` rows of one bucket ``size`` (width, height) split over ``files`` shards."""
    rows = toy_rows(n, size[0], size[1], seed)
    per = -(-n // files)
    return [
        write_shard(
            directory / f"shard-{k:03d}.parquet",
            rows[k * per : (k + 1) * per],
            stage,
            seed,
            batch_size,
        )
        for k in range(files)
        if rows[k * per : (k + 1) * per]
    ]
