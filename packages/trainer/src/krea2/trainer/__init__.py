"""krea2.trainer: FSDP2 + tensor-parallel training of krea2.dit models, resumable to the step.

The names below are the public API. Most submodules import torch, so this root imports
nothing: each name loads its module on first use (the ``krea2`` CLI imports the root).
"""

from __future__ import annotations

from krea2.infra.lazy import lazy_exports

__version__ = "0.1.0"

_MODULE_OF = {
    # the job config (TOML + --set overrides) and its checks
    "JobConfig": "config",
    "ModelConfig": "config",
    "TextConfig": "config",
    "OptimizerConfig": "config",
    "ScheduleConfig": "config",
    "ParallelConfig": "config",
    "IrepaConfig": "config",
    "LoraConfig": "config",
    "StageConfig": "config",
    "CheckpointConfig": "config",
    "StabilityConfig": "config",
    "ObserveConfig": "config",
    "DataConfig": "config",
    "OptimizerName": "config",
    "ScheduleDecay": "config",
    "SpikeAction": "config",
    "Float8Recipe": "config",
    "BaseQuant": "config",
    "CheckpointingMode": "config",
    "ParamDtype": "config",
    "Autocast": "config",
    "Prediction": "config",
    "InitDevice": "config",
    "Backend": "config",
    "load_job": "config",
    "validate_job": "validate",
    # running a job
    "Trainer": "trainer",
    "TrainingStopped": "trainer",
    # another objective on the same loop (krea2.rl's preference optimization)
    "Objective": "step",
    "StageRun": "step",
    "WeightEma": "ema",
    "update_lr": "step",
    "finish_grads": "step",
    "sample_generator": "objective",
    "draw_time_and_noise": "objective",
    "stage_mu": "objective",
    "DistEnv": "distributed",
    "all_reduce_sum": "distributed",
    "shutdown": "distributed",
    "run_job": "cli",
    # the stage list's objectives (krea2.objectives entry points) and continuing a run
    "ObjectiveSpec": "objectives",
    "registered_objectives": "objectives",
    "objective_spec": "objectives",
    "stage_settings": "objectives",
    "continuation_job": "continuation",
    "link_finished": "continuation",
    "adopt_weights": "continuation",
    "export_stage": "stage_export",
    "stage_weights": "stage_export",
    # using a trained job
    "load_stage_module": "inference",
    "sample_stage": "inference",
    "sample_run": "inference",
    "expand_prompts": "expand_client",
    "sample_module": "inference",
    "stage_root": "inference",
    "conditioning_record": "inference",
    "read_metrics": "observe",
    "plot_run": "plot",
    "average": "merge",
    "pma_from_run": "merge",
    "merge_to_file": "merge",
    "ties_merge": "merge",
    "task_arithmetic": "merge",
    # LoRA adapters out (diffusers, ComfyUI, merged)
    "AdapterFormat": "adapters",
    "export_adapter": "adapters",
    "read_adapter": "checkpoint_tensors",
    # data, planning and test fixtures
    "ShardIndex": "data",
    "Layout": "projection",
    "project": "projection",
    "write_toy_shards": "testing",
    "write_toy_dataset": "testing",
}

__all__ = ["__version__", *_MODULE_OF]

__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)
