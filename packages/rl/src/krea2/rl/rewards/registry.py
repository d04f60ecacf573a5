"""Rewards by name, for the CLI and the servers: ``load_reward("artifact:heads/a.npz")``."""

from __future__ import annotations

from pathlib import Path

from krea2.rl.rewards.contract import Reward

REWARD_KINDS: dict[str, str] = {
    "rubric": "the ShapesWorld rubric verifier (same as rubric-shapes)",
    "rubric-shapes": "the ShapesWorld rubric verifier: share of the prompt's requirements met",
    "rubric-llm:LLM_URL[,VLM_URL]": "real prompts: an LLM splits, a VLM checks (OpenAI API)",
    "shape-fidelity": "ShapesWorld: template IoU of the prompt's objects with their shapes",
    "shape-fidelity:whole": "the same, times the share of object pixels in the asked objects",
    "text": "OCR of the image against the prompt's quoted words (edit distance)",
    "artifact:PATH": "structural-defect head saved by train_artifact_reward (score 1 - P)",
    "aesthetic:PATH": "Bradley-Terry head saved by train_aesthetic_reward",
    "remote:URL": "a reward server (token from KREA2_REWARD_TOKEN)",
}


def _head_path(kind: str, arg: str) -> Path:
    if not arg:
        raise ValueError(f"{kind} needs the path of its saved head: {kind}:PATH")
    path = Path(arg)
    if not path.is_file():
        raise ValueError(f"no {kind} head at {path}; train one first (train_{kind}_reward)")
    return path


def load_reward(spec: str) -> Reward:
    """The reward named by ``spec`` (see :data:`REWARD_KINDS`); raises ValueError naming the
    bad spec and the known kinds."""
    kind, _, arg = spec.partition(":")
    if kind in ("rubric", "rubric-shapes") and not arg:
        from krea2.rl.rewards.rubric_shapes import ShapesRubricReward

        return ShapesRubricReward()
    if kind == "shape-fidelity" and arg in ("", "whole"):
        from krea2.rl.rewards.shape_fidelity import ShapeFidelityReward

        return ShapeFidelityReward(whole=arg == "whole")
    if kind == "text" and not arg:
        from krea2.rl.rewards.text import TextRenderingReward

        return TextRenderingReward()
    if kind == "artifact":
        from krea2.rl.rewards.artifact import ArtifactReward

        return ArtifactReward.load(_head_path(kind, arg))
    if kind == "aesthetic":
        from krea2.rl.rewards.aesthetic import AestheticReward

        return AestheticReward.load(_head_path(kind, arg))
    if kind == "rubric-llm" and arg:
        from krea2.rl.rewards.openai_client import OpenAICompatibleClient
        from krea2.rl.rewards.rubric_llm import RubricReward

        llm_url, _, vlm_url = arg.partition(",")
        llm = OpenAICompatibleClient(llm_url)
        return RubricReward(llm, OpenAICompatibleClient(vlm_url) if vlm_url else llm)
    if kind == "remote" and arg:
        import os

        from krea2.rl.rewards.client import RewardClient

        return RewardClient(arg, os.environ.get("KREA2_REWARD_TOKEN"))
    known = "\n  ".join(f"{k}: {v}" for k, v in REWARD_KINDS.items())
    raise ValueError(f"unknown reward {spec!r}; known kinds:\n  {known}")
