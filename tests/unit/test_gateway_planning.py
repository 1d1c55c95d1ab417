"""plan_request: routes, preferences, privileges, the body allowlist, sampling, privacy.

Pure: every case is a table row, no server."""

from __future__ import annotations

from typing import Any

import pytest

from quantdrift.gateway.chain.planning import Incoming, Plan, Refusal, plan_request
from quantdrift.gateway.chain.routing import RouteDirective
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.guards.auth import OPEN, Principal

CONFIG = parse_config(
    {
        "precisions": {"int4": ["http://a"], "int8": ["http://b"], "bf16": ["http://c"]},
        "routes": {
            "r1": {"candidate": "int4", "reference": "bf16"},
            "r2": {"candidate": "int8", "reference": "bf16", "shadow_sample_rate": 1.0},
        },
        "shadow_sample_rate": 0.5,
        "extra_body_fields": ["top_k"],
    }
)
TEAM = Principal("team", frozenset({"r1"}), high_precision=False)
MESSAGES = [{"role": "user", "content": "hi"}]


def plan(
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    who: Principal = OPEN,
    state: RouteDirective | None = None,
    request_id: str = "req-1",
    config: Any = CONFIG,
) -> Plan | Refusal:
    return plan_request(
        config,
        {"messages": MESSAGES, **(body or {})},
        Incoming(headers or {}, who, request_id, directive_of=lambda route: state),
        sample_salt="secret",
    )


@pytest.mark.parametrize(
    ("body", "headers", "route"),
    [
        ({}, {}, "r1"),
        ({"model": "r2"}, {}, "r2"),
        ({"model": "gpt-4o"}, {}, "r1"),  # a model name that is not a route: the default
        ({"route": "r2", "model": "r1"}, {}, "r2"),
        ({"route": "r1"}, {"x-quantdrift-route": "r2"}, "r2"),
    ],
)
def test_route_resolution(body: dict[str, Any], headers: dict[str, str], route: str) -> None:
    p = plan(body, headers)
    assert isinstance(p, Plan) and p.route == route


@pytest.mark.parametrize(
    ("body", "headers", "who", "status", "code"),
    [
        ({"route": "nope"}, {}, OPEN, 404, "model_not_found"),
        ({"model": "r2"}, {}, TEAM, 403, "route_not_allowed"),
        ({"precision_preference": "high_precision"}, {}, TEAM, 403, "preference_not_allowed"),
        ({}, {"x-precision-preference": "high_precision"}, TEAM, 403, "preference_not_allowed"),
        ({"precision_preference": "fastest"}, {}, OPEN, 400, "invalid_value"),
        ({"messages": []}, {}, OPEN, 400, "invalid_value"),
        ({"frobnicate": True}, {}, OPEN, 400, "unknown_parameter"),
        ({"n": 0}, {}, OPEN, 400, "invalid_value"),
        ({"n": 99}, {}, OPEN, 400, "invalid_value"),
        ({"top_logprobs": 21, "logprobs": True}, {}, OPEN, 400, "invalid_value"),
    ],
)
def test_refusals(
    body: dict[str, Any], headers: dict[str, str], who: Principal, status: int, code: str
) -> None:
    r = plan(body, headers, who)
    assert isinstance(r, Refusal) and (r.status, r.code) == (status, code)


def test_the_body_allowlist() -> None:
    p = plan({"top_k": 3, "precision_preference": "cost_optimized", "expected_keys": ["a"]})
    assert isinstance(p, Plan)
    assert p.body["top_k"] == 3  # configured extra field
    assert "precision_preference" not in p.body and "expected_keys" not in p.body
    drop = CONFIG.model_copy(update={"unknown_fields": "drop"})
    q = plan({"frobnicate": 1}, config=drop)
    assert isinstance(q, Plan) and "frobnicate" not in q.body
    assert q.dropped_fields == ("frobnicate",)


def test_stream_usage_n_and_logprobs_as_asked() -> None:
    p = plan({"stream": True, "stream_options": {"include_usage": True}, "n": 3,
              "logprobs": True, "top_logprobs": 2})  # fmt: skip
    assert isinstance(p, Plan)
    assert (p.stream, p.include_usage, p.n, p.user_top_logprobs) == (True, True, 3, 2)
    assert "stream" not in p.body and "stream_options" not in p.body
    assert p.body["top_logprobs"] == 5  # the gateway's own probes want 5; the client gets 2


def test_sampling_is_keyed_on_the_gateways_id_and_salt() -> None:
    mirrored = {
        rid: p.shadow
        for rid in (f"req-{i}" for i in range(400))
        if isinstance(p := plan(request_id=rid, headers={"x-request-id": "fixed"}), Plan)
    }
    share = sum(mirrored.values()) / len(mirrored)
    assert 0.4 < share < 0.6  # rate 0.5, whatever the client's X-Request-Id
    p = plan(headers={"x-request-id": "fixed"})
    assert isinstance(p, Plan) and p.client_request_id == "fixed" and p.request_id == "req-1"


def test_rolled_back_routes_do_not_shadow_and_private_header() -> None:
    state = RouteDirective("rollback", "bf16", None)
    p = plan({"model": "r2"}, {"x-quantdrift-private": "1"}, state=state)
    assert isinstance(p, Plan)
    assert p.decision.serve == "bf16" and not p.shadow and p.private


@pytest.mark.parametrize(
    ("filling", "temperature", "share"),
    [
        (False, 0.7, 0.0),  # the configured share (0 here)
        (True, 0.7, 0.25),  # a route whose sampled floor fills: noise_fill.max_rate
        (True, None, 0.25),  # unknown decoding counts as sampled
        (True, 0, 0.0),  # greedy requests never fill a floor: two greedy runs agree
    ],
)
def test_a_filling_floor_raises_the_noise_share_of_sampled_requests(
    filling: bool, temperature: float | None, share: float
) -> None:
    body: dict[str, Any] = {"messages": MESSAGES}
    if temperature is not None:
        body["temperature"] = temperature
    noisy = 0
    for i in range(800):
        incoming = Incoming({}, OPEN, f"req-{i}", lambda route: None, filling=lambda r: filling)
        p = plan_request(CONFIG, body, incoming, sample_salt="secret")
        assert isinstance(p, Plan)
        noisy += p.noise
    assert abs(noisy / 800 - share) < 0.05


def test_noise_fill_is_capped_and_can_be_turned_off() -> None:
    config = CONFIG.model_copy(update={"noise_sample_rate": 0.4})
    assert config.noise_rate("r1", filling=True) == 0.4  # never below the route's own
    off = parse_config({**CONFIG.model_dump(), "noise_fill": {"max_rate": 0.0}})
    assert off.noise_rate("r1", filling=True) == 0.0
