"""The distillation memory projection: each layout keeps what it says it keeps, and the
table lists every layout (all built)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from krea2.dit.config import get_config
from krea2.rl.distill import distill_memory
from krea2.trainer import finetune_memory


def test_layouts_hold_their_models():
    cfg = get_config("krea2-12b")
    full = finetune_memory(cfg, "full", "bf16", 8)
    lora = finetune_memory(cfg, "lora", "bf16", 8)
    copy = distill_memory(cfg, "full", "copy", 8)
    # a bf16 teacher plus two trained DiTs (fp32 masters and their grads + moments)
    assert copy.weights_gib == pytest.approx(lora.base_gib + 2 * full.base_gib)
    assert copy.trainable_gib == pytest.approx(2 * full.trainable_gib)
    one_base = distill_memory(cfg, "lora", "adapter", 8)
    assert one_base.weights_gib == pytest.approx(lora.base_gib)  # the teacher is the base
    assert one_base.trainable_gib == pytest.approx(2 * lora.trainable_gib)
    lora_fake = distill_memory(cfg, "full", "lora", 8)
    assert one_base.total_gib < lora_fake.total_gib < copy.total_gib
    assert distill_memory(cfg, "full", "copy", 64).total_gib < copy.total_gib
    with pytest.raises(ValueError, match="is not one of"):
        distill_memory(cfg, "lora", "copy", 8)


def test_the_command_prints_the_table_and_refuses_bad_counts():
    from krea2.rl.cli import app

    out = CliRunner().invoke(app, ["distill-memory", "--gpus", "8,64"])
    assert out.exit_code == 0, out.output
    rows = [ln for ln in out.output.splitlines() if ln.startswith("| full") or "| LoRA" in ln]
    assert len(rows) == 6 and "not yet" not in out.output
    assert sum("on the student's base" in r for r in rows) == 2  # the LoRA student's layout
    bad = CliRunner().invoke(app, ["distill-memory", "--gpus", "eight"])
    assert bad.exit_code != 0
