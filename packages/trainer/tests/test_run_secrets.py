"""A run folder holds no credential: a token in the environment never lands on disk."""

from __future__ import annotations

import json

from krea2.trainer.cli import run_job

PLANTED = "tok-93b1e7-planted-in-the-environment"


def test_no_file_of_a_run_folder_holds_a_planted_token(write_job, tmp_path, monkeypatch):
    monkeypatch.setenv("KREA2_REWARD_TOKEN", PLANTED)
    monkeypatch.setenv("KREA2_CLUSTER_SECRET", PLANTED)
    run_job(write_job("secret", steps=2), [], resume=False)
    run = tmp_path / "secret"
    files = [p for p in run.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert PLANTED.encode() not in path.read_bytes(), path
    recorded = json.loads((run / "run.json").read_text())["environment"]["vars"]
    assert recorded["KREA2_REWARD_TOKEN"] == "***"  # the name says a token was set
