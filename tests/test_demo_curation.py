"""The demo records its curation stage as done only when the warehouse says every row is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from krea2.infra import UserError
from krea2.pipeline import curation


def test_workers_that_exit_0_with_rows_left_do_not_complete_the_stage(
    cluster_file: Path, tmp_path: Path, monkeypatch
):
    pool = tmp_path / "pool"
    pool.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        pixels = rng.integers(0, 255, (300, 300, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(pool / f"img-{i}.png")
    ran: list[list[str]] = []
    # Workers that stop early and still exit 0 (as a signalled worker used to): nothing done.
    monkeypatch.setattr(curation, "parallel", lambda cmds, log=None, **kw: ran.extend(cmds))
    with pytest.raises(UserError, match="'analyze' ended with 0 of 3 rows done"):
        curation.curate_pool(pool, cluster_file, workers=2, log=tmp_path / "log")
    assert ran == [["curate", "run", "--stages", "analyze", "--cluster", str(cluster_file)]] * 2
