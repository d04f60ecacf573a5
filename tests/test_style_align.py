"""The style module's preference pairs (krea2.pipeline.style_align): ranked by style
similarity − leakage with ShapesEval held, and the stage that trains them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from krea2.pipeline.config import StyleAlignSettings
from krea2.pipeline.style_align import ALIGNED, aligned_job, candidate_pairs, pair_reward


def test_a_pair_prefers_style_minus_leakage_and_never_trades_content_for_it():
    measures = {  # 3 cases x 4 samples
        "similarity": [[0.9, 0.2, 0.5, 0.95], [0.3, 0.8, 0.6, 0.4], [0.5, 0.52, 0.5, 0.51]],
        "leaked": [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]],
        "content": [[1, 1, 0.5, 1], [0.5, 0.5, 1, 0.5], [1, 1, 1, 1]],
    }
    pairs = candidate_pairs(measures, min_gap=0.1)
    # case 0: sample 3 is the most similar but leaked (reward -0.05): it is the loser;
    # case 1: sample 2 alone has the best content, so it wins over the more similar 1;
    # case 2: every gap is under min_gap, so no pair
    assert pairs == [(0, 0, 3), (1, 2, 0)]
    assert candidate_pairs(measures, min_gap=0.0)[2] == (2, 1, 0)


def test_the_toy_csd_shares_the_ranking_by_its_weight():
    measures = {  # 1 case x 3 samples: rule-based similarity and the CSD disagree
        "similarity": [[0.6, 0.5, 0.4]],
        "csd": [[0.1, 0.5, 0.9]],
        "leaked": [[0, 0, 0]],
        "content": [[1, 1, 1]],
    }
    assert candidate_pairs(measures, min_gap=0.1) == [(0, 0, 2)]  # csd_weight 0: not read
    assert candidate_pairs(measures, min_gap=0.1, csd_weight=0.5) == [(0, 2, 0)]
    reward = pair_reward(measures, csd_weight=0.5)
    np.testing.assert_allclose(reward, [[0.35, 0.5, 0.65]])
    assert candidate_pairs({k: v for k, v in measures.items() if k != "csd"}, 0.1) == [(0, 0, 2)]
    with pytest.raises(ValueError, match="csd_weight"):
        StyleAlignSettings(csd_weight=1.5)


def test_the_aligned_stage_continues_the_style_stage_alone(tmp_path: Path):
    from krea2.trainer import JobConfig, StageConfig

    style = StageConfig(name="style", objective="style", data=["x/*.parquet"])
    job = JobConfig(run_dir=str(tmp_path), stages=[StageConfig(name="raw"), style])
    a = StyleAlignSettings(steps=20, batch_size=8, lr=1e-4)
    out = aligned_job((job, 1), tmp_path / "shards", a)
    stage = out.stages[-1]
    assert [s.name for s in out.stages] == ["raw", "style", ALIGNED]
    assert (stage.objective, stage.style_from, stage.steps, stage.batch_size) == (
        "stpo", "style", 20, 8)  # fmt: skip
    assert stage.settings["beta"] == a.preference.beta and stage.spike_guard is False
    with pytest.raises(ValueError, match="whole pairs"):
        StyleAlignSettings(batch_size=7)
    assert np.isfinite(stage.lr)


def test_spearman_is_exact_where_the_ranks_are():
    from krea2.pipeline.style_stage import spearman

    s = [0.0, 0.25, 0.5, 0.75, 1.0]
    assert spearman(s, [0.1, 0.2, 0.4, 0.3, 0.5]) == 0.9  # one swap: 1 - 6*2/120, exactly
    assert spearman(s, [1, 2, 3, 4, 5]) == 1.0 and spearman(s, [5, 4, 3, 2, 1]) == -1.0
    assert spearman(s, [1, 1, 1, 1, 1]) == 0.0
