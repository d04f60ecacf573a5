"""Experiment tracking: one interface over TensorBoard (the default: local event files,
nothing to sign up for), Weights & Biases and MLflow.

A tracker receives what a run's JSON-lines log holds: the resolved config once, numeric
scalars per step (non-numbers are skipped), and images (PNG files, e.g. sample grids).
Backends are imported when a tracker is opened, so ``krea2.infra`` stays light: TensorBoard
comes with the ``tracking`` extra; W&B and MLflow are installed by the user (``pip install
wandb`` / ``pip install mlflow``), and a missing one is a :class:`MissingExtraError` that
says so. This module needs neither torch nor numpy.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from krea2.infra.errors import UserError
from krea2.infra.extras import MissingExtraError, import_extra

TRACKERS = ("tensorboard", "wandb", "mlflow", "none")


class Tracker(Protocol):
    """Where a run's config, scalars and images go besides its own files."""

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log_scalars(self, step: int, values: Mapping[str, Any], prefix: str = "") -> None: ...

    def log_image(self, step: int, tag: str, png: Path) -> None: ...

    def close(self) -> None: ...


def scalars(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of ``values`` (bools and non-numbers dropped), keys under
    ``prefix/`` when a prefix is given."""
    out = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[f"{prefix}/{key}" if prefix else key] = float(value)
    return out


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``optimizer.lr``); lists and paths as strings."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        elif isinstance(value, bool | int | float | str) or value is None:
            out[name] = value
        else:
            out[name] = json.dumps(value, default=str)
    return out


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; UserError if the bytes are not a PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise UserError("tracker images must be PNG files")
    return struct.unpack(">II", png[16:24])


class NullTracker:
    """``tracker = "none"``: the JSON-lines log only."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        pass

    def log_scalars(self, step: int, values: Mapping[str, Any], prefix: str = "") -> None:
        pass

    def log_image(self, step: int, tag: str, png: Path) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Event files under ``logdir`` (``tensorboard --logdir RUN_DIR/tensorboard``), written
    with TensorBoard's own event writer and protos (no TensorFlow, no torch)."""

    def __init__(self, logdir: Path) -> None:
        import_extra("tensorboard", "tracking")
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        Path(logdir).mkdir(parents=True, exist_ok=True)
        self.logdir = Path(logdir)
        self._writer = EventFileWriter(str(logdir))

    def _write(self, step: int, values: list) -> None:
        import time

        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        event = Event(wall_time=time.time(), step=step, summary=Summary(value=values))
        self._writer.add_event(event)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The config as a TOML-like text summary (TensorBoard's Text tab)."""
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        lines = [f"    {k} = {v!r}" for k, v in flatten(config).items()]
        tensor = TensorProto(
            dtype=7,  # DT_STRING
            string_val=["\n".join(lines).encode()],
            tensor_shape=TensorShapeProto(dim=[]),
        )
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        self._write(0, [Summary.Value(tag="config", metadata=meta, tensor=tensor)])
        self._writer.flush()

    def log_scalars(self, step: int, values: Mapping[str, Any], prefix: str = "") -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        numbers = scalars(values, prefix)
        if numbers:
            self._write(step, [Summary.Value(tag=k, simple_value=v) for k, v in numbers.items()])

    def log_image(self, step: int, tag: str, png: Path) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        data = Path(png).read_bytes()
        width, height = png_size(data)
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=data)
        self._write(step, [Summary.Value(tag=tag, image=image)])
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _optional(module: str):
    """W&B and MLflow are not krea2 extras (each pulls a large client); say how to get them."""
    try:
        return import_extra(module, "tracking")
    except MissingExtraError:
        raise MissingExtraError(
            f"tracker {module!r} needs the {module} package, which is not installed; "
            f"pip install {module} (or choose tracker = 'tensorboard')"
        ) from None


class WandbTracker:
    """A W&B run (``project``/``name``); files under ``run_dir/wandb``."""

    def __init__(self, run_dir: Path, project: str, name: str | None) -> None:
        self._wandb = _optional("wandb")
        self._run = self._wandb.init(project=project, name=name, dir=str(run_dir), resume="allow")

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(flatten(config), allow_val_change=True)

    def log_scalars(self, step: int, values: Mapping[str, Any], prefix: str = "") -> None:
        numbers = scalars(values, prefix)
        if numbers:
            self._run.log(numbers, step=step)

    def log_image(self, step: int, tag: str, png: Path) -> None:
        self._run.log({tag: self._wandb.Image(str(png))}, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    """An MLflow run in experiment ``project`` at ``uri`` (default: ``run_dir/mlruns``)."""

    def __init__(self, run_dir: Path, project: str, name: str | None, uri: str | None) -> None:
        self._mlflow = _optional("mlflow")
        self._mlflow.set_tracking_uri(uri or (Path(run_dir) / "mlruns").resolve().as_uri())
        self._mlflow.set_experiment(project)
        self._run = self._mlflow.start_run(run_name=name)

    def log_config(self, config: Mapping[str, Any]) -> None:
        # MLflow params are short strings; the whole config also goes in as one artifact.
        flat = flatten(config)
        self._mlflow.log_params({k: str(v)[:500] for k, v in flat.items()})
        self._mlflow.log_dict(dict(config), "config.json")

    def log_scalars(self, step: int, values: Mapping[str, Any], prefix: str = "") -> None:
        numbers = scalars(values, prefix)
        if numbers:
            safe = {k.replace("/", "."): v for k, v in numbers.items()}
            self._mlflow.log_metrics(safe, step=step)

    def log_image(self, step: int, tag: str, png: Path) -> None:
        self._mlflow.log_artifact(str(png), artifact_path=f"images/{tag}")

    def close(self) -> None:
        self._mlflow.end_run()


def open_tracker(
    kind: str,
    run_dir: Path,
    project: str = "krea2",
    name: str | None = None,
    uri: str | None = None,
) -> Tracker:
    """The tracker ``kind`` (one of :data:`TRACKERS`) for the run in ``run_dir``:
    TensorBoard writes ``run_dir/tensorboard``; W&B and MLflow log to ``project`` as
    ``name`` (MLflow at ``uri``, default a local ``run_dir/mlruns`` store)."""
    run_dir = Path(run_dir)
    if kind == "tensorboard":
        return TensorBoardTracker(run_dir / "tensorboard")
    if kind == "wandb":
        return WandbTracker(run_dir, project, name)
    if kind == "mlflow":
        return MlflowTracker(run_dir, project, name, uri)
    if kind == "none":
        return NullTracker()
    raise UserError(f"tracker {kind!r} is not one of {list(TRACKERS)}")


__all__ = [
    "TRACKERS",
    "MlflowTracker",
    "NullTracker",
    "TensorBoardTracker",
    "Tracker",
    "WandbTracker",
    "flatten",
    "open_tracker",
    "scalars",
]
