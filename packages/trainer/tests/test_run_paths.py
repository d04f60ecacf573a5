"""A run records absolute paths for every component a job names relatively (issue #39's
``qwen3-vl:tiny-model/text_encoder``, ``qwen-image:tiny-model/vae``, ``init_from =
"tiny-model"``), so sampling, export and --resume work from any directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from krea2.trainer.config import JobConfig, StageConfig
from krea2.trainer.run_paths import absolute_paths


def test_component_specs_init_from_and_data_become_absolute(tmp_path):
    for folder in ("tiny-model/text_encoder", "tiny-model/vae", "shards"):
        (tmp_path / folder).mkdir(parents=True)
    job = JobConfig()
    job = replace(
        job,
        run_dir=Path("runs/lora-tiny"),
        text=replace(job.text, encoder="qwen3-vl:tiny-model/text_encoder"),
        model=replace(job.model, autoencoder="qwen-image:tiny-model/vae"),
        stages=[StageConfig(name="lora", data=["shards/*.parquet"], init_from="tiny-model")],
    )
    fixed = absolute_paths(job, tmp_path)
    assert fixed.run_dir == tmp_path / "runs" / "lora-tiny"
    assert fixed.text.encoder == f"qwen3-vl:{tmp_path / 'tiny-model' / 'text_encoder'}"
    assert fixed.model.autoencoder == f"qwen-image:{tmp_path / 'tiny-model' / 'vae'}"
    (stage,) = fixed.stages
    assert stage.init_from == str(tmp_path / "tiny-model")
    assert stage.data == [str(tmp_path / "shards" / "*.parquet")]
    # Not paths, or nothing there: left as written (the preflight reports a missing one).
    kept = replace(job, model=replace(job.model, autoencoder="pixel:2"),
                   stages=[replace(job.stages[0], init_from="previous")])  # fmt: skip
    kept = absolute_paths(kept, tmp_path / "elsewhere")
    assert kept.model.autoencoder == "pixel:2" and kept.stages[0].init_from == "previous"
    assert kept.text.encoder == "qwen3-vl:tiny-model/text_encoder"
