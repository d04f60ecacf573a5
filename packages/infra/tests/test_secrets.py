"""Credentials never reach what krea2 writes: run.json's and hang bundles' environment."""

from __future__ import annotations

import json

from krea2.infra.secrets import is_secret_name, recorded_environment
from krea2.infra.watchdog import collect_env

PLANTED = "tok-3c1f9a0e-planted"


def test_credential_names_are_recognised():
    credentials = (
        "KREA2_REWARD_TOKEN",
        "HF_TOKEN",
        "PGPASSWORD",
        "KREA2_CLUSTER_SECRET",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "KREA2_DSN",
        "KREA2_SIGNING_KEY",
    )
    for name in credentials:
        assert is_secret_name(name), name
    for name in ("KREA2_PROGRESS", "OMP_NUM_THREADS", "NCCL_DEBUG", "MASTER_ADDR", "RANK"):
        assert not is_secret_name(name), name


def test_a_snapshot_keeps_the_names_and_hides_the_values():
    env = {"KREA2_REWARD_TOKEN": PLANTED, "KREA2_PROGRESS": "plain", "HOME": "/root",
           "OMP_NUM_THREADS": "2", "RANK": "0"}  # fmt: skip
    got = recorded_environment(("KREA2_", "OMP_"), ("RANK",), env)
    assert got == {"KREA2_PROGRESS": "plain", "KREA2_REWARD_TOKEN": "***",
                   "OMP_NUM_THREADS": "2", "RANK": "0"}  # fmt: skip


def test_the_hang_bundle_environment_holds_no_planted_token(monkeypatch):
    monkeypatch.setenv("KREA2_REWARD_TOKEN", PLANTED)
    monkeypatch.setenv("NCCL_AUTH_SECRET", PLANTED)
    dumped = json.dumps(collect_env())
    assert PLANTED not in dumped and "KREA2_REWARD_TOKEN" in dumped
