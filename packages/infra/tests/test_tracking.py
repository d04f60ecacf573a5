"""Trackers: TensorBoard event files hold the config, the numeric scalars and PNG images
(read back with TensorBoard's own reader); W&B and MLflow, when missing, say what to install."""

from __future__ import annotations

import importlib.util
import struct
import zlib
from pathlib import Path

import pytest

from krea2.infra.errors import UserError
from krea2.infra.extras import MissingExtraError
from krea2.infra.tracking import flatten, open_tracker, scalars


def _png(path: Path, width: int, height: int) -> Path:
    """A solid grey RGB PNG, written by hand (this package needs no imaging library)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\x00" + b"\x80" * (3 * width) for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    return path


def test_scalars_keep_finite_numbers_only():
    got = scalars({"loss": 0.5, "step": 3, "nan": float("nan"), "ok": True, "path": "x"}, "train")
    assert got == {"train/loss": 0.5, "train/step": 3.0}


def test_flatten_dots_nested_keys():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {
        "a.b": 1,
        "a.c": "[1, 2]",
        "d": None,
    }


def test_tensorboard_events_hold_config_scalars_and_images(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = open_tracker("tensorboard", tmp_path)
    tracker.log_config({"optimizer": {"lr": 0.001}, "seed": 0})
    for step in range(3):
        tracker.log_scalars(step, {"loss": 1.0 / (step + 1), "note": "skip me"}, "train")
    tracker.log_image(2, "samples/pretrain", _png(tmp_path / "grid.png", 6, 4))
    tracker.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([1.0, 0.5, 1 / 3])
    assert "train/note" not in acc.Tags()["scalars"]
    (image,) = acc.Images("samples/pretrain")
    assert (image.step, image.width, image.height) == (2, 6, 4)
    text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "optimizer.lr = 0.001" in text


@pytest.mark.parametrize("kind", ["wandb", "mlflow"])
def test_a_missing_tracker_package_names_the_install(tmp_path, kind):
    if importlib.util.find_spec(kind) is not None:
        pytest.skip(f"{kind} is installed here")
    with pytest.raises(MissingExtraError, match=f"pip install {kind}"):
        open_tracker(kind, tmp_path)


def test_an_unknown_tracker_lists_the_choices(tmp_path):
    with pytest.raises(UserError, match="tensorboard"):
        open_tracker("neptune", tmp_path)


def test_images_must_be_png(tmp_path):
    (tmp_path / "x.png").write_bytes(b"GIF89a not a png")
    tracker = open_tracker("tensorboard", tmp_path)
    with pytest.raises(UserError, match="PNG"):
        tracker.log_image(0, "x", tmp_path / "x.png")
