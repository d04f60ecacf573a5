"""Synthetic training shards for tests and benchmarks: numbered classes of coloured blobs.

Each image is one blob (a square or a disc of one palette colour) filling most of one cell
of a 3x3 grid on black; its captions name the class and the cell by number ("blob 5 in
cell 4"), so the trainer carries no world's vocabulary. Tests that need ShapesWorld's words
and verifier live in the root ``tests/`` and take their shards from ``krea2.curate``.
Shards are written through ``krea2.infra.shards.write_shard`` (the contract's writer).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from krea2.infra.shards import write_shard

PALETTE: tuple[tuple[int, int, int], ...] = (  # RGB
    (230, 40, 40),
    (40, 200, 60),
    (50, 90, 230),
    (240, 220, 40),
)
FORMS = ("square", "disc")
CLASSES = len(PALETTE) * len(FORMS)  # class k: colour PALETTE[k // 2], form FORMS[k % 2]
CELLS = 9  # row-major 3x3 grid


def draw(blob_class: int, cell: int, width: int, height: int) -> np.ndarray:
    """uint8 [H, W, 3]: the blob of ``blob_class`` filling most of grid ``cell``, on black."""
    color, form = PALETTE[blob_class // len(FORMS)], FORMS[blob_class % len(FORMS)]
    img = np.zeros((height, width, 3), dtype=np.uint8)
    cw, ch = width / 3, height / 3
    cx, cy = (cell % 3 + 0.5) * cw, (cell // 3 + 0.5) * ch
    r = 0.42 * min(cw, ch)
    yy, xx = np.mgrid[0:height, 0:width] + 0.5
    if form == "square":
        inside = (np.abs(xx - cx) <= r) & (np.abs(yy - cy) <= r)
    else:
        inside = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    img[inside] = color
    return img


def blob_captions(blob_class: int, cell: int) -> list[dict]:
    """One caption per contract format (long, medium, short, tags, json)."""
    spec = {"objects": [{"class": blob_class, "cell": cell}]}
    return [
        {"format": "long", "text": f"blob {blob_class} in cell {cell} of a black background"},
        {"format": "medium", "text": f"blob {blob_class} in cell {cell}"},
        {"format": "short", "text": f"blob {blob_class}"},
        {"format": "tags", "text": f"blob {blob_class}, cell {cell}"},
        {"format": "json", "text": json.dumps(spec)},
    ]


def png_bytes(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def toy_rows(n: int, width: int, height: int, seed: int, prefix: str = "s") -> list[dict]:
    """``n`` contract rows of bucket ``width`` x ``height``, blobs drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        color = int(rng.integers(len(PALETTE)))
        form = int(rng.integers(len(FORMS)))
        cell = int(rng.integers(CELLS))
        blob_class = color * len(FORMS) + form
        rows.append(
            {
                "key": f"{prefix}{seed}-{i:06d}",
                "image": png_bytes(draw(blob_class, cell, width, height)),
                "uri": None,
                "crop": None,
                "width": width,
                "height": height,
                "bucket": f"{width}x{height}",
                "captions": blob_captions(blob_class, cell),
                "meta": json.dumps({"class": blob_class, "cell": cell}),
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
            rows[k * per : (k + 1) * per],
            directory / f"shard-{k:03d}.parquet",
            stage=stage,
            seed=seed,
            batch_size=batch_size,
        )
        for k in range(files)
        if rows[k * per : (k + 1) * per]
    ]


def write_toy_dataset(
    out: Path,
    sides: tuple[int, ...] = (32, 64),
    rows: int = 4096,
    eval_rows: int = 256,
    seed: int = 0,
) -> dict[str, int]:
    """The data of ``configs/toy/pretrain.toml``: for each side S, ``out/blobs-S`` (``rows``
    training rows) and ``out/blobs-S-eval`` (``eval_rows`` held-out rows, other draws).
    Returns rows written per folder name."""
    written = {}
    for side in sides:
        for name, n, draw_seed in (
            (f"blobs-{side}", rows, seed),
            (f"blobs-{side}-eval", eval_rows, seed + 1),
        ):
            files = max(1, n // 2048)
            write_toy_shards(out / name, n, (side, side), files, 64, draw_seed, f"p{side}")
            written[name] = n
    return written


# Photo-like sizes (width, height): landscape, portrait, square, wide.
PHOTO_SIZES: tuple[tuple[int, int], ...] = ((480, 360), (360, 480), (400, 400), (512, 288))


def write_photo_folder(out: str | Path, n: int = 12, seed: int = 0) -> Path:
    """A stand-in for a folder of one's own photos (docs, tests of ``krea2 train prepare``):
    ``n`` pictures ``photo-NN.jpg`` at photo sizes and aspect ratios (``PHOTO_SIZES`` in
    turn), each a blob on a noisy colour gradient (so curate's flat-image, duplicate and
    size filters keep it), with its caption in ``photo-NN.txt``."""
    from PIL import Image

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        width, height = PHOTO_SIZES[i % len(PHOTO_SIZES)]
        blob_class, cell = int(rng.integers(CLASSES)), int(rng.integers(CELLS))
        top, bottom = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        ramp = np.linspace(0.0, 1.0, height)[:, None, None]
        pixels = top + (bottom - top) * ramp + rng.normal(0, 24, (height, width, 3))
        blob = draw(blob_class, cell, width, height)
        pixels = np.where(blob.any(axis=2, keepdims=True), blob, pixels)
        image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
        image.save(out / f"photo-{i:02d}.jpg", quality=90)
        caption = blob_captions(blob_class, cell)[0]["text"].replace("black", "noisy")
        (out / f"photo-{i:02d}.txt").write_text(caption + "\n")
    return out


# Real photographs that ship inside installed wheels (scikit-image, scikit-learn, matplotlib;
# public-domain or freely licensed, see each package's data README), with a one-line caption
# each: (package, path inside it, caption).
REAL_PHOTOS: tuple[tuple[str, str, str], ...] = (
    ("skimage", "data/astronaut.png", "a smiling astronaut in an orange spacesuit before a flag"),
    ("skimage", "data/chelsea.png", "a tabby cat looking into the camera"),
    ("skimage", "data/coffee.png", "a cup of coffee on a red saucer"),
    ("skimage", "data/rocket.jpg", "a rocket on its launch pad at dusk"),
    ("skimage", "data/hubble_deep_field.jpg", "distant galaxies scattered over a black sky"),
    ("skimage", "data/motorcycle_left.png", "a red motorcycle parked in a garage"),
    ("skimage", "data/retina.jpg", "a photograph of the back of a human eye"),
    ("skimage", "data/ihc.png", "a microscope view of stained tissue"),
    ("sklearn", "datasets/images/china.jpg", "a chinese temple between green trees"),
    ("sklearn", "datasets/images/flower.jpg", "an orange dahlia on a green background"),
    ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg", "a woman in uniform before a flag"),
)


def write_real_photo_folder(out: str | Path) -> Path:
    """A folder of real photos to try the LoRA flow on (docs/lora.md): the
    :data:`REAL_PHOTOS` found in this environment's wheels, as ``NN-name.jpg`` (PNGs
    re-encoded as JPEG, the way photos arrive), each with its caption in ``NN-name.txt``
    except the second, whose caption is in ``NN-name.json`` (``{"caption": ...}``: the
    other sidecar convention); plus ``copy-of-00.jpg``, the first photo re-encoded smaller
    at a lower quality (the near-duplicate a folder of one's own photos often holds), with
    its own caption. FileNotFoundError naming the missing packages when fewer than 6
    photos are found."""
    import importlib.util

    from PIL import Image

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    found: list[tuple[Path, str]] = []
    missing: set[str] = set()
    for package, rel, caption in REAL_PHOTOS:
        spec = importlib.util.find_spec(package)  # located, not imported (sklearn is slow)
        path = Path(spec.origin).parent / rel if spec and spec.origin else None
        if path is not None and path.is_file():
            found.append((path, caption))
        else:
            missing.add(package)
    if len(found) < 6:
        raise FileNotFoundError(
            f"found {len(found)} of {len(REAL_PHOTOS)} bundled photos (missing packages: "
            f"{', '.join(sorted(missing))}); pip install scikit-image scikit-learn, or use a "
            "folder of your own images with <name>.txt captions"
        )
    for i, (path, caption) in enumerate(found):
        stem = f"{i:02d}-{path.stem.replace('_', '-')}"
        with Image.open(path) as im:
            im.convert("RGB").save(out / f"{stem}.jpg", quality=92)
        if i == 1:
            (out / f"{stem}.json").write_text(json.dumps({"caption": caption}) + "\n")
        else:
            (out / f"{stem}.txt").write_text(caption + "\n")
    first, caption = found[0]
    with Image.open(first) as im:
        smaller = im.convert("RGB").resize((im.width * 3 // 4, im.height * 3 // 4))
        smaller.save(out / "copy-of-00.jpg", quality=70)
    (out / "copy-of-00.txt").write_text(caption + ", again\n")
    return out


def tiny_job_head(
    run_dir: str | Path,
    seed: int = 0,
    every: int = 3,
    keep_last: int = 10,
    *,
    prediction: str | None = None,
    max_tokens: int = 16,
    deterministic: bool = True,
    log_every: int | None = 1,
) -> str:
    """The TOML of a tiny deterministic job up to its stages (tests of objectives on the
    trainer's loop): the toy DiT at 2 blocks of width 64, 16 text tokens, one thread,
    deterministic kernels, no loader workers, checkpoints every ``every`` steps, a log row
    per step. Callers append their ``[stability]`` and ``[[stages]]`` tables. Keywords for
    the tests that need other settings: ``prediction`` (the model's; None: its default),
    ``max_tokens``, ``deterministic`` (False: torch's default kernels) and ``log_every``
    (None: no ``[observe]`` table, for callers that write their own)."""
    model = "" if prediction is None else f'prediction = "{prediction}"\n'
    observe = "" if log_every is None else f"[observe]\nlog_every = {log_every}\n"
    return f"""
run_dir = "{run_dir}"
seed = {seed}
[model]
name = "toy"
{model}[model.overrides]
depth = 2
width = 64
mlp_hidden = 128
time_dim = 64
text_dim = 32
text_mlp_hidden = 64
[text]
max_tokens = {max_tokens}
{_run_tail(every, keep_last, deterministic)}{observe}"""


def release_job_head(
    run_dir: str | Path, release: str | Path, seed: int = 0, every: int = 2, keep_last: int = 10
) -> str:
    """The TOML of a tiny deterministic job on a release-shaped model folder
    (``krea2.dit.testing.write_tiny_model_folder``: Qwen3-VL text encoder of 12 taps, 16
    tokens; Qwen-Image VAE; the ``tiny`` DiT built on meta), up to its stages: one thread,
    deterministic kernels, no loader workers, checkpoints every ``every`` steps (0: at the
    end). Callers append their other tables and ``[[stages]]``."""
    release = Path(release)
    return f"""
run_dir = "{run_dir}"
seed = {seed}
[model]
name = "tiny"
autoencoder = "qwen-image:{release / "vae"}"
init_device = "meta"
[model.overrides]
text_taps = 12
latent_channels = 16
[text]
encoder = "qwen3-vl:{release / "text_encoder"}"
max_tokens = 16
{_run_tail(every, keep_last)}"""


def _run_tail(every: int, keep_last: int, deterministic: bool = True) -> str:
    """One thread, deterministic kernels (unless not ``deterministic``), no loader workers,
    checkpoints every ``every`` steps keeping ``keep_last``: what every tiny test job
    shares."""
    return f"""[parallel]
threads = 1
deterministic = {str(deterministic).lower()}
[data]
workers = 0
[checkpoint]
every = {every}
keep_last = {keep_last}
"""
