"""krea2.infra: configs, logging, metrics, checkpoints, the shard schema and the CLI host.

Import from the submodules (``from krea2.infra.config import load_config``) or from here
(``from krea2.infra import load_config``). Names here resolve lazily on first use, so
``import krea2.infra`` (which every ``krea2`` command does) loads neither torch nor pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.infra import alerts as alerts
    from krea2.infra import atomic as atomic
    from krea2.infra import batching as batching
    from krea2.infra import checkpoint as checkpoint
    from krea2.infra import checkpoint_layout as checkpoint_layout
    from krea2.infra import cli as cli
    from krea2.infra import config as config
    from krea2.infra import errors as errors
    from krea2.infra import extras as extras
    from krea2.infra import fabric as fabric
    from krea2.infra import gpu as gpu
    from krea2.infra import heap as heap
    from krea2.infra import host as host
    from krea2.infra import k8s as k8s
    from krea2.infra import lazy as lazy
    from krea2.infra import logging as logging
    from krea2.infra import metrics as metrics
    from krea2.infra import pause as pause
    from krea2.infra import quiet as quiet
    from krea2.infra import rank_health as rank_health
    from krea2.infra import rng as rng
    from krea2.infra import secrets as secrets
    from krea2.infra import serving as serving
    from krea2.infra import shards as shards
    from krea2.infra import snapshot as snapshot
    from krea2.infra import stragglers as stragglers
    from krea2.infra import telemetry as telemetry
    from krea2.infra import termination as termination
    from krea2.infra import watchdog as watchdog
    from krea2.infra.alerts import Alert as Alert
    from krea2.infra.batching import MicroBatcher as MicroBatcher
    from krea2.infra.checkpoint import CheckpointManager as CheckpointManager
    from krea2.infra.checkpoint import PendingSave as PendingSave
    from krea2.infra.checkpoint_layout import CheckpointCorruptError as CheckpointCorruptError
    from krea2.infra.checkpoint_layout import CheckpointEntry as CheckpointEntry
    from krea2.infra.checkpoint_layout import CheckpointMismatchError as CheckpointMismatchError
    from krea2.infra.checkpoint_layout import scan_checkpoints as scan_checkpoints
    from krea2.infra.config import ConfigError as ConfigError
    from krea2.infra.config import build_config as build_config
    from krea2.infra.config import config_to_dict as config_to_dict
    from krea2.infra.config import config_to_toml as config_to_toml
    from krea2.infra.config import load_config as load_config
    from krea2.infra.config import parse_override as parse_override
    from krea2.infra.config import save_config as save_config
    from krea2.infra.errors import UserError as UserError
    from krea2.infra.extras import MissingExtraError as MissingExtraError
    from krea2.infra.extras import import_extra as import_extra
    from krea2.infra.fabric import IbPort as IbPort
    from krea2.infra.fabric import read_ib_ports as read_ib_ports
    from krea2.infra.gpu import GpuReading as GpuReading
    from krea2.infra.gpu import NvmlReader as NvmlReader
    from krea2.infra.heap import keep_freed_memory as keep_freed_memory
    from krea2.infra.lazy import lazy_exports as lazy_exports
    from krea2.infra.logging import get_logger as get_logger
    from krea2.infra.logging import setup_logging as setup_logging
    from krea2.infra.metrics import counter as counter
    from krea2.infra.metrics import gauge as gauge
    from krea2.infra.metrics import histogram as histogram
    from krea2.infra.metrics import mark_worker_dead as mark_worker_dead
    from krea2.infra.metrics import metric_name as metric_name
    from krea2.infra.metrics import start_exporter as start_exporter
    from krea2.infra.pause import pause_point as pause_point
    from krea2.infra.progress import Progress as Progress
    from krea2.infra.progress import format_duration as format_duration
    from krea2.infra.progress import progress as progress
    from krea2.infra.progress import track as track
    from krea2.infra.rank_health import RankHealth as RankHealth
    from krea2.infra.rng import capture_rng_state as capture_rng_state
    from krea2.infra.rng import restore_rng_state as restore_rng_state
    from krea2.infra.secrets import recorded_environment as recorded_environment
    from krea2.infra.shards import CAPTION_FORMATS as CAPTION_FORMATS
    from krea2.infra.shards import COLUMNS as COLUMNS
    from krea2.infra.shards import METADATA_BATCH_SIZE as METADATA_BATCH_SIZE
    from krea2.infra.shards import METADATA_SEED as METADATA_SEED
    from krea2.infra.shards import METADATA_STAGE as METADATA_STAGE
    from krea2.infra.shards import ShardSchemaError as ShardSchemaError
    from krea2.infra.shards import bucket_name as bucket_name
    from krea2.infra.shards import parse_bucket as parse_bucket
    from krea2.infra.shards import shard_arrow_schema as shard_arrow_schema
    from krea2.infra.shards import validate_shard_file as validate_shard_file
    from krea2.infra.shards import validate_shard_schema as validate_shard_schema
    from krea2.infra.shards import validate_shard_table as validate_shard_table
    from krea2.infra.shards import write_shard as write_shard
    from krea2.infra.snapshot import TelemetryConfig as TelemetryConfig
    from krea2.infra.stragglers import StragglerConfig as StragglerConfig
    from krea2.infra.stragglers import StragglerDetector as StragglerDetector
    from krea2.infra.stragglers import StragglerReport as StragglerReport
    from krea2.infra.telemetry import TelemetryCollector as TelemetryCollector
    from krea2.infra.tracking import open_tracker as open_tracker
    from krea2.infra.watchdog import HangWatchdog as HangWatchdog
    from krea2.infra.watchdog import hang_timeout as hang_timeout

__version__ = "0.1.0"

_SUBMODULES = (
    "atomic",
    "batching",
    "checkpoint",  # needs the torch extra
    "checkpoint_layout",
    "cli",
    "config",
    "errors",
    "heap",
    "host",
    "lazy",
    "logging",
    "metrics",
    "progress",
    "pause",
    "secrets",
    "quiet",
    "termination",
    "serving",
    "rng",
    "shards",  # the schema needs the shards extra (pyarrow)
    "extras",
    "gpu",  # NVML needs the gpu extra
    "fabric",
    "alerts",
    "snapshot",
    "telemetry",
    "stragglers",
    "watchdog",
    "rank_health",
    "k8s",  # launch manifests; applying them needs the k8s extra
)

# Public name -> the submodule that defines it.
_NAME_TO_MODULE = {
    "UserError": "errors",
    "ConfigError": "config",
    "build_config": "config",
    "config_to_dict": "config",
    "config_to_toml": "config",
    "load_config": "config",
    "parse_override": "config",
    "save_config": "config",
    "get_logger": "logging",
    "setup_logging": "logging",
    "counter": "metrics",
    "gauge": "metrics",
    "histogram": "metrics",
    "mark_worker_dead": "metrics",
    "metric_name": "metrics",
    "start_exporter": "metrics",
    "CheckpointManager": "checkpoint",
    "PendingSave": "checkpoint",
    "CheckpointCorruptError": "checkpoint_layout",
    "CheckpointMismatchError": "checkpoint_layout",
    "CheckpointEntry": "checkpoint_layout",
    "scan_checkpoints": "checkpoint_layout",
    "pause_point": "pause",
    "MicroBatcher": "batching",
    "recorded_environment": "secrets",
    "Progress": "progress",
    "format_duration": "progress",
    "progress": "progress",
    "track": "progress",
    "capture_rng_state": "rng",
    "restore_rng_state": "rng",
    "keep_freed_memory": "heap",
    "lazy_exports": "lazy",
    "CAPTION_FORMATS": "shards",
    "COLUMNS": "shards",
    "METADATA_BATCH_SIZE": "shards",
    "METADATA_SEED": "shards",
    "METADATA_STAGE": "shards",
    "ShardSchemaError": "shards",
    "bucket_name": "shards",
    "parse_bucket": "shards",
    "shard_arrow_schema": "shards",
    "validate_shard_file": "shards",
    "validate_shard_schema": "shards",
    "validate_shard_table": "shards",
    "write_shard": "shards",
    "MissingExtraError": "extras",
    "import_extra": "extras",
    "open_tracker": "tracking",
    "GpuReading": "gpu",
    "NvmlReader": "gpu",
    "IbPort": "fabric",
    "read_ib_ports": "fabric",
    "Alert": "alerts",
    "TelemetryCollector": "telemetry",
    "TelemetryConfig": "snapshot",
    "StragglerConfig": "stragglers",
    "StragglerDetector": "stragglers",
    "StragglerReport": "stragglers",
    "HangWatchdog": "watchdog",
    "hang_timeout": "watchdog",
    "RankHealth": "rank_health",
}

__all__ = [*_SUBMODULES, *_NAME_TO_MODULE]

__getattr__, __dir__ = lazy_exports(__name__, {**dict.fromkeys(_SUBMODULES), **_NAME_TO_MODULE})
