"""The fine-tuning memory projection: its adapter count is peft's, the one-H200 LoRA row
fits and full fine-tuning does not, and docs/trainer.md holds the table the code prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from krea2.dit.config import get_config
from krea2.trainer.config import LoraConfig
from krea2.trainer.finetune_projection import finetune_memory, lora_params, memory_table

DOCS = Path(__file__).parents[3] / "docs" / "trainer.md"


def test_lora_params_count_what_peft_injects():
    from krea2.dit.model import Krea2DiT
    from krea2.trainer.lora import apply_lora

    cfg = get_config("tiny", text_taps=12, latent_channels=16)
    dit = Krea2DiT(cfg)
    apply_lora(dit, LoraConfig(rank=4))
    trainable = sum(p.numel() for p in dit.parameters() if p.requires_grad)
    assert trainable == lora_params(cfg, 4)


def test_one_h200_fits_lora_but_not_full_fine_tuning_of_the_release():
    cfg = get_config("krea2-12b")
    assert finetune_memory(cfg, "lora", "bf16", 1).fits()
    assert not finetune_memory(cfg, "full", "bf16", 1).fits()
    assert finetune_memory(cfg, "full", "bf16", 8).fits()
    with pytest.raises(ValueError, match="int8 base cannot be trained"):
        finetune_memory(cfg, "full", "int8", 8)


def test_the_docs_table_is_the_one_the_code_prints():
    assert memory_table(get_config("krea2-12b")) in DOCS.read_text()
