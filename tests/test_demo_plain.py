"""The plain `krea2 demo --quick --until export-64` that tests/test_demo.py compares its
stopped-and-resumed run with: asked for here so that another worker makes it while the
stopped runs take theirs (``demo_runs.plain_run_to_export``)."""

from __future__ import annotations


def test_a_plain_run_stops_after_the_last_export(plain_demo):
    out, record = plain_demo
    assert record["returncode"] == 0, record["stdout"] + record["stderr"]
    assert "stopped after export-64" in record["stdout"]
    assert (out / "stages" / "export-64.json").exists()
    assert not (out / "stages" / "pretrain.json").exists()
