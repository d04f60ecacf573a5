"""krea2.rl.serving: the checks every rl and expander server shares (the HTTP probes are in
test_reward_server_limits.py, test_annotate_security.py and expander's test_serving_limits.py)."""

from __future__ import annotations

import pytest

from krea2.infra.errors import UserError
from krea2.rl import BadJson, TokenRequired, check_bind, is_loopback, load_json, token_matches


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True),
     ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False),
     ("example.com", False)],
)  # fmt: skip
def test_is_loopback_knows_every_loopback_address_and_no_name(host, loopback):
    assert is_loopback(host) is loopback


def test_check_bind_needs_a_token_off_loopback_and_names_the_fix():
    check_bind("127.0.0.1", None, "x", "X_TOKEN")
    check_bind("0.0.0.0", "t", "x", "X_TOKEN")
    with pytest.raises(TokenRequired, match=r"--token or X_TOKEN\) or bind 127.0.0.1") as e:
        check_bind("0.0.0.0", None, "the thing", "X_TOKEN")
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)


def test_token_matches_only_the_exact_bearer_header():
    assert token_matches("Bearer s3cret", "s3cret")
    assert not any(token_matches(h, "s3cret") for h in (None, "", "s3cret", "Bearer s3cre"))


def test_load_json_bounds_values_and_depth_before_and_after_parsing():
    assert load_json(b'{"a": [1, 2, {"b": null}]}') == {"a": [1, 2, {"b": None}]}
    assert load_json(b"[" * 32 + b"]" * 32) is not None
    for raw in (b"[" * 33 + b"]" * 33, b"[" * 100_000, b"[" + b"0," * 100_000 + b"0]", b"{x"):
        with pytest.raises(BadJson):
            load_json(raw)
