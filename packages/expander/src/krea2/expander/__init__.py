"""krea2.expander: the prompt expander (report §8).

Built so far:

* GDPO on trl's GRPOTrainer (`gdpo`, `rewards`): faithfulness, image rewards scored
  against the user's request, group diversity; normalize-then-sum; safety gates that cap
  a gated completion's advantage at 0;
* SFT with trl's `SFTTrainer` (`sft`, `toy_model`): a local Qwen3, or on the toy a tiny
  Qwen3 and a byte-level BPE trained on the chats, learned from scratch on CPU;
* SFT data (`sft_data`, `user_prompts`): synthetic short requests from long captions (by
  rule on ShapesWorld, where each request knows the requirements it kept and dropped;
  through an LLM over an OpenAI-compatible server for real captions), thinking traces and
  distribution shaping;
* faithfulness (`faithfulness`): verifiable on ShapesWorld, an LLM judge otherwise;
* serving (`server`, `krea2 expander serve|expand`): an OpenAI-compatible chat API
  (transformers; `--vllm` runs vLLM's server with the same API);
* the stage of a run (`stage`): SFT, GDPO with and without the diversity reward, each
  measured in front of a trained DiT (faithfulness, ShapesEval on the request, diversity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from krea2.infra.lazy import lazy_exports

if TYPE_CHECKING:  # the real types for type checkers (``X as X``: re-exported)
    from krea2.expander import cli as cli
    from krea2.expander.faithfulness import Faithfulness as Faithfulness
    from krea2.expander.faithfulness import LlmFaithfulnessJudge as LlmFaithfulnessJudge
    from krea2.expander.faithfulness import check_faithfulness as check_faithfulness
    from krea2.expander.gdpo import GatedGRPOTrainer as GatedGRPOTrainer
    from krea2.expander.gdpo import GdpoConfig as GdpoConfig
    from krea2.expander.gdpo import run_gdpo as run_gdpo
    from krea2.expander.rewards import ExpanderRewards as ExpanderRewards
    from krea2.expander.rewards import Gate as Gate
    from krea2.expander.rewards import StageRenderer as StageRenderer
    from krea2.expander.rewards import pixel_embedding as pixel_embedding
    from krea2.expander.server import ChatLimits as ChatLimits
    from krea2.expander.server import Expander as Expander
    from krea2.expander.server import create_app as create_app
    from krea2.expander.sft import SftConfig as SftConfig
    from krea2.expander.sft import generate as generate
    from krea2.expander.sft import run_sft as run_sft
    from krea2.expander.sft_data import LlmUserPrompts as LlmUserPrompts
    from krea2.expander.sft_data import Shaping as Shaping
    from krea2.expander.sft_data import chat_example as chat_example
    from krea2.expander.sft_data import read_shard_scenes as read_shard_scenes
    from krea2.expander.sft_data import shapes_sft_examples as shapes_sft_examples
    from krea2.expander.sft_data import split_answer as split_answer
    from krea2.expander.stage import evaluate_expander as evaluate_expander
    from krea2.expander.stage import run_expander_stage as run_expander_stage
    from krea2.expander.stage import scene_requests as scene_requests
    from krea2.expander.stage_settings import ExpanderStageSettings as ExpanderStageSettings
    from krea2.expander.toy_model import ToyModelConfig as ToyModelConfig
    from krea2.expander.toy_model import load_model as load_model
    from krea2.expander.toy_model import tiny_qwen3 as tiny_qwen3
    from krea2.expander.toy_model import train_tokenizer as train_tokenizer
    from krea2.expander.user_prompts import UserPrompt as UserPrompt
    from krea2.expander.user_prompts import UserPromptConfig as UserPromptConfig
    from krea2.expander.user_prompts import user_prompt as user_prompt

__version__ = "0.1.0"

_HOMES: dict[str, str | None] = {
    "Faithfulness": "faithfulness",
    "LlmFaithfulnessJudge": "faithfulness",
    "check_faithfulness": "faithfulness",
    "LlmUserPrompts": "sft_data",
    "Shaping": "sft_data",
    "chat_example": "sft_data",
    "read_shard_scenes": "sft_data",
    "shapes_sft_examples": "sft_data",
    "ExpanderRewards": "rewards",
    "Gate": "rewards",
    "StageRenderer": "rewards",
    "pixel_embedding": "rewards",
    "GatedGRPOTrainer": "gdpo",
    "GdpoConfig": "gdpo",
    "run_gdpo": "gdpo",
    "ChatLimits": "server",
    "Expander": "server",
    "create_app": "server",
    "cli": None,
    "ExpanderStageSettings": "stage_settings",
    "run_expander_stage": "stage",
    "evaluate_expander": "stage",
    "scene_requests": "stage",
    "SftConfig": "sft",
    "run_sft": "sft",
    "generate": "sft",
    "split_answer": "sft_data",
    "ToyModelConfig": "toy_model",
    "load_model": "toy_model",
    "tiny_qwen3": "toy_model",
    "train_tokenizer": "toy_model",
    "UserPrompt": "user_prompts",
    "UserPromptConfig": "user_prompts",
    "user_prompt": "user_prompts",
}

__all__ = sorted(_HOMES)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
