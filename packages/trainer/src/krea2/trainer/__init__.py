"""krea2.trainer: FSDP2 + tensor-parallel training of krea2.dit models, resumable to the step.

The names below are the public API. Most submodules import torch, so this root imports
nothing: each name loads its module on first use (the ``krea2`` CLI imports the root).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.trainer.adapters import AdapterFormat as AdapterFormat
    from krea2.trainer.adapters import export_adapter as export_adapter
    from krea2.trainer.checkpoint_tensors import read_adapter as read_adapter
    from krea2.trainer.cli import run_job as run_job
    from krea2.trainer.config import Autocast as Autocast
    from krea2.trainer.config import Backend as Backend
    from krea2.trainer.config import BaseQuant as BaseQuant
    from krea2.trainer.config import CheckpointConfig as CheckpointConfig
    from krea2.trainer.config import CheckpointingMode as CheckpointingMode
    from krea2.trainer.config import DataConfig as DataConfig
    from krea2.trainer.config import Float8Recipe as Float8Recipe
    from krea2.trainer.config import InitDevice as InitDevice
    from krea2.trainer.config import IrepaConfig as IrepaConfig
    from krea2.trainer.config import JobConfig as JobConfig
    from krea2.trainer.config import LoraConfig as LoraConfig
    from krea2.trainer.config import ModelConfig as ModelConfig
    from krea2.trainer.config import ObserveConfig as ObserveConfig
    from krea2.trainer.config import OptimizerConfig as OptimizerConfig
    from krea2.trainer.config import OptimizerName as OptimizerName
    from krea2.trainer.config import ParallelConfig as ParallelConfig
    from krea2.trainer.config import ParamDtype as ParamDtype
    from krea2.trainer.config import Prediction as Prediction
    from krea2.trainer.config import ScheduleConfig as ScheduleConfig
    from krea2.trainer.config import ScheduleDecay as ScheduleDecay
    from krea2.trainer.config import SpikeAction as SpikeAction
    from krea2.trainer.config import StabilityConfig as StabilityConfig
    from krea2.trainer.config import StageConfig as StageConfig
    from krea2.trainer.config import TextConfig as TextConfig
    from krea2.trainer.config import load_job as load_job
    from krea2.trainer.continuation import adopt_weights as adopt_weights
    from krea2.trainer.continuation import continuation_job as continuation_job
    from krea2.trainer.continuation import link_finished as link_finished
    from krea2.trainer.data import ShardIndex as ShardIndex
    from krea2.trainer.distributed import DistEnv as DistEnv
    from krea2.trainer.distributed import all_reduce_sum as all_reduce_sum
    from krea2.trainer.distributed import shutdown as shutdown
    from krea2.trainer.ema import WeightEma as WeightEma
    from krea2.trainer.expand_client import expand_prompts as expand_prompts
    from krea2.trainer.finetune_projection import FinetuneMemory as FinetuneMemory
    from krea2.trainer.finetune_projection import finetune_memory as finetune_memory
    from krea2.trainer.finetune_projection import lora_params as lora_params
    from krea2.trainer.inference import conditioning_record as conditioning_record
    from krea2.trainer.inference import encode_images as encode_images
    from krea2.trainer.inference import load_stage_module as load_stage_module
    from krea2.trainer.inference import sample_module as sample_module
    from krea2.trainer.inference import sample_run as sample_run
    from krea2.trainer.inference import sample_stage as sample_stage
    from krea2.trainer.inference import stage_root as stage_root
    from krea2.trainer.merge import average as average
    from krea2.trainer.merge import merge_to_file as merge_to_file
    from krea2.trainer.merge import pma_from_run as pma_from_run
    from krea2.trainer.merge import task_arithmetic as task_arithmetic
    from krea2.trainer.merge import ties_merge as ties_merge
    from krea2.trainer.objective import draw_time_and_noise as draw_time_and_noise
    from krea2.trainer.objective import sample_generator as sample_generator
    from krea2.trainer.objective import stage_mu as stage_mu
    from krea2.trainer.objectives import ObjectiveSpec as ObjectiveSpec
    from krea2.trainer.objectives import objective_spec as objective_spec
    from krea2.trainer.objectives import registered_objectives as registered_objectives
    from krea2.trainer.objectives import stage_settings as stage_settings
    from krea2.trainer.observe import read_metrics as read_metrics
    from krea2.trainer.plot import plot_run as plot_run
    from krea2.trainer.projection import Layout as Layout
    from krea2.trainer.projection import project as project
    from krea2.trainer.stage_export import export_stage as export_stage
    from krea2.trainer.stage_export import stage_weights as stage_weights
    from krea2.trainer.step import Objective as Objective
    from krea2.trainer.step import StageRun as StageRun
    from krea2.trainer.step import finish_grads as finish_grads
    from krea2.trainer.step import update_lr as update_lr
    from krea2.trainer.style_export import stage_style_path as stage_style_path
    from krea2.trainer.style_run import style_job as style_job
    from krea2.trainer.style_run import train_style as train_style
    from krea2.trainer.style_settings import StyleSettings as StyleSettings
    from krea2.trainer.style_transforms import ReferenceMode as ReferenceMode
    from krea2.trainer.style_transforms import style_references as style_references
    from krea2.trainer.testing import write_toy_dataset as write_toy_dataset
    from krea2.trainer.testing import write_toy_shards as write_toy_shards
    from krea2.trainer.trainer import Trainer as Trainer
    from krea2.trainer.trainer import TrainingStopped as TrainingStopped
    from krea2.trainer.validate import validate_job as validate_job

__version__ = "0.1.0"

_MODULE_OF = {
    # memory projections (krea2 train memory)
    "FinetuneMemory": "finetune_projection",
    "finetune_memory": "finetune_projection",
    "lora_params": "finetune_projection",
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
    # the style-reference objective (a module on the frozen base)
    "StyleSettings": "style_settings",
    "ReferenceMode": "style_transforms",
    "style_references": "style_transforms",
    "stage_style_path": "style_export",
    "style_job": "style_run",
    "train_style": "style_run",
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
    "encode_images": "inference",
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
