"""The shadow runner's queue and jobs, without I/O: drop-oldest, stripped payloads, re-checks."""

from __future__ import annotations

from typing import Any

from quantdrift.gateway.chain.planning import Incoming, Plan, plan_request
from quantdrift.gateway.chain.routing import RouteDirective
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.guards.auth import OPEN
from quantdrift.gateway.openai_wire import Accumulator
from quantdrift.gateway.shadow.pairs import candidate_suspended
from quantdrift.gateway.shadow.runner import QUEUE_FULL, ShadowRunner
from quantdrift.gateway.upstream.pools import Upstreams
from quantdrift.schemas.privacy import prompt_hash

CONFIG = parse_config(
    {
        "precisions": {"int4": ["http://a"], "bf16": ["http://b"]},
        "routes": {"r": {"candidate": "int4", "reference": "bf16"}},
        "shadow_sample_rate": 1.0,
        "shadow_queue": 2,
    }
)


def runner(state: dict[str, RouteDirective | None]) -> ShadowRunner:
    return ShadowRunner(CONFIG, Upstreams(CONFIG, shadow=True), None, state.get, prompt_salt="s")


def plan(request_id: str) -> Plan:
    p = plan_request(
        CONFIG,
        {"messages": [{"role": "user", "content": "hi"}]},
        Incoming({}, OPEN, request_id, directive_of=lambda _: None),
        sample_salt="x",
    )
    assert isinstance(p, Plan) and p.shadow
    return p


def answer(n: int = 2, tokens: int = 50, k: int = 20) -> Any:
    acc = Accumulator("int4")
    for i in range(tokens):
        for index in range(n):
            top = [{"token": f"t{j}", "logprob": -float(j)} for j in range(k)]
            entry = {"token": f"w{i}", "logprob": -0.1, "top_logprobs": top}
            acc.add({"choices": [{"index": index, "delta": {"content": f"w{i} "},
                                  "logprobs": {"content": [entry]}}]})  # fmt: skip
    return acc.finish()


def test_a_full_queue_drops_the_oldest_and_counts_it() -> None:
    r = runner({})
    for i in range(5):
        r.submit(plan(f"req-{i}"), answer(tokens=2))
    assert r.depth == 2 and r.dropped == {QUEUE_FULL: 3}
    assert [job.plan.request_id for job in r._queue] == ["req-3", "req-4"]


def test_queued_jobs_hold_only_what_the_pair_needs() -> None:
    r = runner({})
    r.submit(plan("req-1"), answer(n=3, tokens=50, k=20))
    user = r._queue[0].user
    assert len(user.choices) == 1  # choice 0 only
    entries = user.choice(0).logprobs_content
    assert len(entries) == 50 and all(
        len(e["top_logprobs"]) == CONFIG.top_logprobs for e in entries
    )
    side = user.output(CONFIG.top_logprobs)
    assert side.tokens and len(side.top_logprobs[0]) == CONFIG.top_logprobs  # type: ignore[index]


def test_a_rolled_back_route_suspends_its_candidate_before_the_call() -> None:
    state: dict[str, RouteDirective | None] = {"r": None}
    p = plan("req-1")
    assert not candidate_suspended(CONFIG, p, state.get)
    state["r"] = RouteDirective("rollback", "bf16", None)
    assert candidate_suspended(CONFIG, p, state.get)


def test_a_route_awaiting_its_preflight_keeps_shadowing_its_candidate() -> None:
    # The check asks route_decision, cap included: a cap of 0 sends users to the
    # reference and pairs the candidate behind it, so the job still calls it.
    p = plan("req-1")
    assert not candidate_suspended(CONFIG, p, lambda _: None, lambda _: 0.0)
    state = {"r": RouteDirective("rollback", "bf16", None)}
    assert candidate_suspended(CONFIG, p, state.get, lambda _: 0.0)


def test_prompt_hash_is_salted() -> None:
    assert prompt_hash("user: hi", "a") != prompt_hash("user: hi", "b")


def test_a_collector_job_carries_no_answer_and_asks_both_sides() -> None:
    r = runner({})
    r.submit(plan("req-1"), None)
    assert r.depth == 1 and r._queue[0].user is None


def test_a_body_past_the_shadow_limit_is_not_mirrored_and_is_counted() -> None:
    r = runner({})
    p = plan("req-1")
    limit = CONFIG.limits.max_shadow_body_bytes
    assert r.admit(p, limit) is p
    admitted = r.admit(p, limit + 1)
    assert not admitted.shadow and not admitted.noise and r.dropped == {"too_large": 1}
