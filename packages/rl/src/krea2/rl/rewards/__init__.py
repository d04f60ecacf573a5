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

from krea2.infra.lazy import lazy_exports

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
