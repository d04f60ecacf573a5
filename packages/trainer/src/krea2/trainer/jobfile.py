"""Load a job: TOML + ``--set`` overrides, including per-stage ones (``stages.1.steps=500``).

``krea2.infra.config`` overrides walk dataclass fields only; a list index such as
``stages.0`` is resolved here first, then the rest goes to ``load_config``.
"""

from __future__ import annotations

import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

import tomli_w

from krea2.infra.config import ConfigError, load_config, parse_override
from krea2.trainer.config import JobConfig


def _set_stage_key(data: dict, keys: list[str], value, text: str) -> None:
    stages = data.setdefault("stages", [])
    try:
        index = int(keys[1])
    except ValueError:
        raise ConfigError(f"override '{text}': '{keys[1]}' is not a stage index") from None
    if not 0 <= index < len(stages):
        raise ConfigError(
            f"override '{text}': stage index {index} is out of range; the job has "
            f"{len(stages)} stage(s)"
        )
    node = stages[index]
    for key in keys[2:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{text}': '{key}' is not a table")
    node[keys[-1]] = value


def load_job(path: str | Path | None, overrides: Sequence[str] = ()) -> JobConfig:
    """The job config; ConfigError (one message naming the key and the file) on any mistake."""
    stage_overrides = [o for o in overrides if o.strip().startswith("stages.")]
    rest = [o for o in overrides if o not in stage_overrides]
    if not stage_overrides:
        return load_config(JobConfig, path, rest)
    if path is not None and not Path(path).is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = tomllib.loads(Path(path).read_text()) if path is not None else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for text in stage_overrides:
        keys, value = parse_override(text)
        if len(keys) < 3:
            raise ConfigError(f"override '{text}' must look like stages.<index>.key=value")
        _set_stage_key(data, keys, value, text)
    name = Path(path).name if path is not None else "job.toml"
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / name
        merged.write_text(tomli_w.dumps(data))
        try:
            return load_config(JobConfig, merged, rest)
        except ConfigError as exc:
            where = f"{path} + --set overrides"
            raise ConfigError(str(exc).replace(str(merged), where)) from None
