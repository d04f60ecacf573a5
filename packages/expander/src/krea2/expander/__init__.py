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

from krea2.infra.lazy import lazy_exports

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
