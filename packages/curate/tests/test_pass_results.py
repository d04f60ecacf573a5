"""Each pass's last counts are kept in the warehouse, so a report or the demo reads them
back instead of parsing what ``krea2 curate run`` printed."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from krea2 import curate
from krea2.curate.cli import app
from krea2.curate.shapes import encode, render, sample_scene


def test_a_pass_run_by_the_command_leaves_its_counts_in_the_warehouse(tmp_path, cluster_file):
    pool = tmp_path / "pool"
    pool.mkdir()
    rng = np.random.default_rng(3)
    for i in range(4):
        png = encode(render(sample_scene(rng), 320, 320), "png")
        (pool / f"scene{i}.png").write_bytes(png)
        if i < 2:  # an exact copy: the dedup pass drops it
            (pool / f"scene{i}-copy.png").write_bytes(png)
    c = str(cluster_file)
    runner = CliRunner()
    for args in (["ingest", str(pool), "--cluster", c],
                 ["run", "--stages", "analyze,dedup", "--cluster", c]):  # fmt: skip
        result = runner.invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    wh = curate.open_warehouse(c)
    try:
        recorded = curate.pass_results(wh, ["dedup", "semantic"])
        assert set(recorded) == {"dedup"}  # semantic never ran
        first = recorded["dedup"]
        assert first["result"]["rows"] == 6 and first["result"]["duplicates"] == 2, first
        assert f"dedup: {first['result']}" in result.output  # what the command printed
        again = curate.run_stages(wh, ["dedup"])["dedup"]
        second = curate.pass_results(wh, ["dedup"])["dedup"]
        assert second["result"] == again and second["finished"] >= first["finished"]
    finally:
        wh.close()


def test_numpy_counts_are_stored_as_numbers_and_other_objects_are_refused(cluster_file):
    wh = curate.open_warehouse(str(cluster_file))
    try:
        counts = {"rows": np.int64(7), "threshold": np.float32(0.5), "per_class": {"a": 1}}
        curate.record_pass_result(wh, "sae", counts)
        assert curate.pass_results(wh, ["sae"])["sae"]["result"] == {
            "rows": 7,
            "threshold": 0.5,
            "per_class": {"a": 1},
        }
        with pytest.raises(TypeError, match="pass 'sae' returned counts that are not JSON"):
            curate.record_pass_result(wh, "sae", {"model": object()})
        assert curate.pass_results(wh, ["sae"])["sae"]["result"]["rows"] == 7  # kept
    finally:
        wh.close()
