"""krea2.rl.rewards: the reward contract (docs/architecture.md, contract 4), reward kinds,
composition, and reward servers with their client.

>>> import numpy as np
>>> from krea2.curate import shapes
>>> from krea2.rl.rewards import ShapesRubricReward
>>> scene = shapes.sample_scene(np.random.default_rng(0))
>>> image = shapes.render(scene, 64, 64)[None]            # [1, 64, 64, 3] uint8
>>> ShapesRubricReward()(image, [shapes.captions(scene)["short"]]).scores
array([1.], dtype=float32)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.rl.rewards import cli as cli
    from krea2.rl.rewards import wire as wire
    from krea2.rl.rewards.aesthetic import AestheticReward as AestheticReward
    from krea2.rl.rewards.aesthetic import preference_accuracy as preference_accuracy
    from krea2.rl.rewards.aesthetic import train_aesthetic_reward as train_aesthetic_reward
    from krea2.rl.rewards.artifact import ARTIFACT_DEFECTS as ARTIFACT_DEFECTS
    from krea2.rl.rewards.artifact import ArtifactReward as ArtifactReward
    from krea2.rl.rewards.artifact import DetectionReport as DetectionReport
    from krea2.rl.rewards.artifact import calibrate_artifact_reward as calibrate_artifact_reward
    from krea2.rl.rewards.artifact import evaluate_artifact_reward as evaluate_artifact_reward
    from krea2.rl.rewards.artifact import grid_defect as grid_defect
    from krea2.rl.rewards.artifact import render_defects as render_defects
    from krea2.rl.rewards.artifact import roc_auc as roc_auc
    from krea2.rl.rewards.artifact import train_artifact_reward as train_artifact_reward
    from krea2.rl.rewards.client import RewardClient as RewardClient
    from krea2.rl.rewards.client import RewardServerError as RewardServerError
    from krea2.rl.rewards.compose import WeightedSum as WeightedSum
    from krea2.rl.rewards.compose import group_normalize as group_normalize
    from krea2.rl.rewards.contract import Reward as Reward
    from krea2.rl.rewards.contract import RewardOutput as RewardOutput
    from krea2.rl.rewards.contract import as_uint8_images as as_uint8_images
    from krea2.rl.rewards.contract import check_batch as check_batch
    from krea2.rl.rewards.contract import empty_output as empty_output
    from krea2.rl.rewards.features import FEATURE_NAMES as FEATURE_NAMES
    from krea2.rl.rewards.features import image_features as image_features
    from krea2.rl.rewards.head import MlpHead as MlpHead
    from krea2.rl.rewards.openai_client import OpenAICompatibleClient as OpenAICompatibleClient
    from krea2.rl.rewards.registry import REWARD_KINDS as REWARD_KINDS
    from krea2.rl.rewards.registry import load_reward as load_reward
    from krea2.rl.rewards.rubric_llm import RUBRIC_SUB_SCORES as RUBRIC_SUB_SCORES
    from krea2.rl.rewards.rubric_llm import RubricReward as RubricReward
    from krea2.rl.rewards.rubric_shapes import REQUIREMENT_KINDS as REQUIREMENT_KINDS
    from krea2.rl.rewards.rubric_shapes import ShapesRubricReward as ShapesRubricReward
    from krea2.rl.rewards.server import TOKEN_ENV as TOKEN_ENV
    from krea2.rl.rewards.server import ServerConfig as ServerConfig
    from krea2.rl.rewards.server import ServerThread as ServerThread
    from krea2.rl.rewards.server import create_app as create_app
    from krea2.rl.rewards.server import serve as serve
    from krea2.rl.rewards.shape_fidelity import ShapeFidelityReward as ShapeFidelityReward
    from krea2.rl.rewards.shape_fidelity import shape_fidelity_score as shape_fidelity_score
    from krea2.rl.rewards.shape_fidelity import shape_fidelity_terms as shape_fidelity_terms
    from krea2.rl.rewards.text import TEXT_SUB_SCORES as TEXT_SUB_SCORES
    from krea2.rl.rewards.text import TextRenderingReward as TextRenderingReward
    from krea2.rl.rewards.text import quoted_texts as quoted_texts
    from krea2.rl.rewards.wire import RequestLimits as RequestLimits

_HOMES: dict[str, str | None] = {
    "Reward": "contract",
    "RewardOutput": "contract",
    "as_uint8_images": "contract",
    "check_batch": "contract",
    "empty_output": "contract",
    "WeightedSum": "compose",
    "group_normalize": "compose",
    "REQUIREMENT_KINDS": "rubric_shapes",
    "ShapesRubricReward": "rubric_shapes",
    "ShapeFidelityReward": "shape_fidelity",
    "shape_fidelity_score": "shape_fidelity",
    "shape_fidelity_terms": "shape_fidelity",
    "TEXT_SUB_SCORES": "text",
    "TextRenderingReward": "text",
    "quoted_texts": "text",
    "MlpHead": "head",
    "FEATURE_NAMES": "features",
    "image_features": "features",
    "ARTIFACT_DEFECTS": "artifact",
    "ArtifactReward": "artifact",
    "calibrate_artifact_reward": "artifact",
    "grid_defect": "artifact",
    "DetectionReport": "artifact",
    "evaluate_artifact_reward": "artifact",
    "render_defects": "artifact",
    "roc_auc": "artifact",
    "train_artifact_reward": "artifact",
    "AestheticReward": "aesthetic",
    "preference_accuracy": "aesthetic",
    "train_aesthetic_reward": "aesthetic",
    "OpenAICompatibleClient": "openai_client",
    "RUBRIC_SUB_SCORES": "rubric_llm",
    "RubricReward": "rubric_llm",
    "REWARD_KINDS": "registry",
    "load_reward": "registry",
    "RequestLimits": "wire",
    "ServerConfig": "server",
    "ServerThread": "server",
    "TOKEN_ENV": "server",
    "create_app": "server",
    "serve": "server",
    "RewardClient": "client",
    "RewardServerError": "client",
    "cli": None,
    "wire": None,
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
