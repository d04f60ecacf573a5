"""krea2.infra: configs, logging, metrics, checkpoints, the shard schema and the CLI host.

Import from the submodules (``from krea2.infra.config import load_config``) or from here
(``from krea2.infra import load_config``). Names here resolve lazily on first use, so
``import krea2.infra`` (which every ``krea2`` command does) loads neither torch nor pyarrow.
"""

from __future__ import annotations

from krea2.infra.lazy import lazy_exports

__version__ = "0.1.0"

_SUBMODULES = (
    "atomic",
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
