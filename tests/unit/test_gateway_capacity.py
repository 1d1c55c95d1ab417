"""Retry budget, outlier ejection and auth: small objects with readable state, time passed in."""

from __future__ import annotations

import hashlib

import pytest

from quantdrift.gateway.gateway_config import ApiKey, AuthConfig
from quantdrift.gateway.guards.auth import OPEN, Authenticator
from quantdrift.gateway.guards.capacity import OutlierDetector, RetryBudget


def test_budget_caps_fallbacks_at_a_share_of_requests() -> None:
    budget = RetryBudget(ratio=0.2, min_per_window=2, window_s=10)
    for i in range(100):
        budget.record_request(i * 0.05)  # 100 requests in 5 s
    granted = sum(budget.try_fallback(5.0) for _ in range(100))
    assert granted == 2 + 20 and budget.refused == 78
    assert budget.try_fallback(30.0) is True  # a new window: the floor again


def test_outliers_are_ejected_for_longer_each_time_and_never_all() -> None:
    od = OutlierDetector(consecutive_failures=3, base_ejection_s=10, max_ejection_s=25)
    assert [od.failure("a", 0.0) for _ in range(3)] == [False, False, True]
    assert od.available(["a", "b"], 5.0) == ["b"]
    assert od.available(["a"], 5.0) == ["a"]  # every server out: try them all
    od.success("a")
    assert [od.failure("a", 11.0) for _ in range(3)] == [False, False, True]
    assert od.ejected("a", 30.0) and not od.ejected(
        "a", 31.5
    )  # second ejection: 2 x 10 s (cap 25 s)
    assert od.ejected_total == 2


def test_keys_are_compared_as_sha256_and_grant_routes_and_privileges() -> None:
    h = hashlib.sha256(b"sk-1").hexdigest()
    auth = Authenticator(AuthConfig(keys=[ApiKey(name="a", sha256=h, routes=["r"])]))
    who = auth.principal("Bearer sk-1")
    assert who is not None and who.may_use("r") and not who.may_use("s")
    assert not who.high_precision
    for header in (None, "", "Bearer", "Basic sk-1", "Bearer sk-2", f"Bearer {h}"):
        assert auth.principal(header) is None
    assert Authenticator(None).principal(None) is OPEN  # no auth section: open


@pytest.mark.parametrize(("token", "ok"), [("adm", True), ("nope", False), (None, False)])
def test_admin_token(token: str | None, ok: bool) -> None:
    auth = Authenticator(AuthConfig(admin_token_sha256=hashlib.sha256(b"adm").hexdigest()))
    assert auth.admin_ok(f"Bearer {token}" if token else None) is ok
    assert Authenticator(AuthConfig()).admin_ok(None)  # no admin token: open


def test_keys_from_the_environment_join_the_configs() -> None:
    import json

    from quantdrift.errors import ConfigError
    from quantdrift.gateway.gateway_config import parse_config
    from quantdrift.services.gateway import ENV_KEYS, with_env_keys

    base = {
        "precisions": {"a": ["http://a"]},
        "routes": {"r": {"candidate": "a", "reference": "a"}},
    }
    h = hashlib.sha256(b"sk-env").hexdigest()
    env = {ENV_KEYS: json.dumps([{"name": "env", "sha256": h, "routes": ["r"]}])}
    with pytest.raises(ConfigError, match="admin_token_sha256"):  # keys, yet /health open
        with_env_keys(parse_config(base), env)
    config = parse_config({**base, "admin_listen": "127.0.0.1:9464"})
    assert with_env_keys(config, {}) is config
    auth = Authenticator(with_env_keys(config, env).auth)
    assert auth.enabled and auth.principal("Bearer sk-env") is not None
    with pytest.raises(ConfigError):
        with_env_keys(config, {ENV_KEYS: "not json"})
    with pytest.raises(ConfigError):  # an unknown route is a config error, not an open door
        with_env_keys(config, {ENV_KEYS: json.dumps([{"name": "x", "sha256": h, "routes": ["s"]}])})
