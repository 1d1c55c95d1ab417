"""The one fallback walker: its rules as tables, then whole walks over scripted pools.

No server: a pool here is an async generator of chunks (or of a failure), the clock
is moved by hand, and the plan is the one ``plan_completion`` makes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest

from quantdrift.errors import UpstreamError, UpstreamTimeout
from quantdrift.gateway.chain.attempts import (
    ChainDeadline,
    Degradations,
    GuardTrip,
    Trace,
    Walk,
    attempt_s,
    guarded,
    refusal,
)
from quantdrift.gateway.chain.completions import CompletionPlan, open_chain, plan_completion
from quantdrift.gateway.chain.planning import Incoming
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.guards.auth import OPEN
from quantdrift.gateway.guards.capacity import RetryBudget
from quantdrift.gateway.telemetry import Telemetry
from quantdrift.gateway.upstream.pools import UpstreamClientError
from quantdrift.schemas.degradation import DegradationEvent

CONFIG = parse_config(
    {
        "precisions": {"int4": ["http://a"], "int8": ["http://b"], "bf16": ["http://c"]},
        "routes": {"r": {"candidate": "int4", "reference": "bf16"}},
    }
)
CHUNK = {"id": "c", "choices": [{"index": 0, "text": "hi"}]}


# -- the rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "length", "left_s", "budget_left", "expected"),
    [
        (0, 3, 5.0, True, True),  # a fallback exists and is allowed: a guard may cut
        (1, 3, 5.0, True, True),
        (2, 3, 5.0, True, False),  # the chain's last is never cut
        (0, 1, 5.0, True, False),  # a chain of one: its only precision is the last
        (0, 3, 0.0, True, False),  # no time left: nowhere to go
        (0, 3, -1.0, True, False),
        (0, 3, 5.0, False, False),  # budget spent: served whole, as the last would be
    ],
)
def test_which_attempts_a_guard_may_cut(
    index: int, length: int, left_s: float, budget_left: bool, expected: bool
) -> None:
    assert guarded(index, length, left_s=left_s, budget_left=budget_left) is expected


@pytest.mark.parametrize(
    ("last", "left_s", "budget_ok", "expected", "token_asked"),
    [
        (False, 5.0, True, None, True),  # falls back: one token taken
        (False, 5.0, False, "budget", True),
        (False, 0.0, True, "deadline", False),  # past the deadline: no token spent
        (False, -2.0, False, "deadline", False),
        (True, 5.0, True, "last", False),  # nothing after the last: no token spent
        (True, 0.0, True, "last", False),
    ],
)
def test_why_a_failure_may_not_fall_back(
    last: bool, left_s: float, budget_ok: bool, expected: str | None, token_asked: bool
) -> None:
    asked: list[bool] = []

    def take_token() -> bool:
        asked.append(True)
        return budget_ok

    assert refusal(last=last, left_s=left_s, take_token=take_token) == expected
    assert bool(asked) is token_asked


@pytest.mark.parametrize(
    ("left_s", "total_s", "expected"),
    [(30.0, 10.0, 10.0), (4.0, 10.0, 4.0), (10.0, 10.0, 10.0)],
)
def test_an_attempt_gets_what_is_left_of_the_chain(
    left_s: float, total_s: float, expected: float
) -> None:
    assert attempt_s(left_s, total_s) == expected


# -- whole walks -------------------------------------------------------------------------


def failure(reason: str, timeout: bool = False) -> UpstreamError:
    exc = UpstreamTimeout(reason) if timeout else UpstreamError(reason)
    exc.reason = reason  # type: ignore[attr-defined]
    return exc


class Pool:
    """A precision's scripted answer: chunks, then maybe a failure; calls are kept."""

    def __init__(self, *script: dict[str, Any] | Exception) -> None:
        self.script = script
        self.calls: list[tuple[float | None, str]] = []
        self.closed = 0

    async def stream(
        self, body: Any, *, total_s: float | None = None, path: str = ""
    ) -> AsyncGenerator[dict[str, Any], None]:
        self.calls.append((total_s, path))
        try:
            for item in self.script:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.closed += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def completion_plan() -> CompletionPlan:
    plan = plan_completion(CONFIG, {"prompt": "hi"}, Incoming({}, OPEN, "c-1", lambda r: None))
    assert isinstance(plan, CompletionPlan) and plan.decision.chain == ("int4", "int8", "bf16")
    return plan


class Harness:
    def __init__(self, pools: dict[str, Pool], budget: RetryBudget | None = None) -> None:
        self.pools, self.clock, self.metrics = pools, Clock(), Telemetry(process=False)
        self.events: list[DegradationEvent] = []
        self.budget = budget or RetryBudget(ratio=0.0, min_per_window=10, window_s=60)
        self.budget.record_request(self.clock())
        self.trace = Trace(self.clock(), self.clock() + 30.0)

    def walk(self) -> Walk:
        return Walk(
            completion_plan(),
            self.trace,
            self.pools,  # type: ignore[arg-type]  # a pool is anything with ``stream``
            self.budget,
            self.metrics,
            Degradations(self.events.append),
            total_s=10.0,
            path="/v1/completions",
            clock=self.clock,
        )

    def fallbacks(self, **labels: str) -> float:
        return self.metrics.value("quantdrift_gateway_fallbacks_total", **labels)

    def refused(self, reason: str) -> float:
        return self.metrics.value("quantdrift_gateway_fallbacks_refused_total", reason=reason)


async def test_upstream_failures_fall_back_with_the_time_left() -> None:
    pools = {"int4": Pool(failure("http_500")), "int8": Pool(CHUNK), "bf16": Pool(CHUNK)}
    h = Harness(pools)
    h.clock.now += 25.0  # 5 s of the chain's 30 s left: every attempt gets at most that
    precision, first, stream = await open_chain(h.walk())
    await stream.aclose()
    assert (precision, first) == ("int8", [CHUNK])
    assert [c for p in pools.values() for c in p.calls] == [(5.0, "/v1/completions")] * 2
    assert pools["int4"].closed == 1  # the failed attempt's stream is closed
    assert h.trace.fallbacks == ["int4:upstream_http_500"]
    assert h.fallbacks(precision="int4", reason="upstream_http_500") == 1
    assert (h.trace.upstream_errors, h.trace.timeouts) == (1, 0)
    assert h.budget.available(h.clock()) and len(h.budget._fallbacks) == 1  # one token


async def test_a_spent_budget_returns_the_failure_instead_of_the_reference() -> None:
    pools = {"int4": Pool(failure("timeout", timeout=True)), "int8": Pool(CHUNK)}
    h = Harness(pools, RetryBudget(ratio=0.0, min_per_window=0, window_s=60))
    with pytest.raises(UpstreamTimeout):
        await open_chain(h.walk())
    assert pools["int8"].calls == []  # never asked
    assert h.trace.fallbacks == ["int4:upstream_timeout"] and h.trace.timeouts == 1
    assert h.refused("budget") == 1 and h.refused("deadline") == 0


async def test_the_last_failure_is_recorded_and_raised_without_a_refusal() -> None:
    pools = {p: Pool(failure("connect")) for p in ("int4", "int8", "bf16")}
    h = Harness(pools)
    with pytest.raises(UpstreamError) as raised:
        await open_chain(h.walk())
    assert str(raised.value) == "connect"
    assert h.trace.fallbacks == [f"{p}:upstream_connect" for p in pools]
    assert h.fallbacks(reason="upstream_connect") == 3
    assert h.refused("budget") == h.refused("deadline") == 0
    assert len(h.budget._fallbacks) == 2  # a token per fallback taken, none for the last


async def test_a_failure_past_the_deadline_is_refused_and_the_next_attempt_never_starts() -> None:
    h = Harness({"int4": Pool(failure("disconnect")), "int8": Pool(CHUNK)})
    walk = h.walk()
    attempts = iter(walk)
    attempt = next(attempts)
    with pytest.raises(UpstreamError):
        async with attempt:
            h.clock.now += 31.0  # the chain's deadline passes while int4 answers
            raise failure("disconnect")
    assert h.refused("deadline") == 1 and len(h.budget._fallbacks) == 0
    with pytest.raises(ChainDeadline):
        next(attempts)


async def test_a_trip_falls_back_with_an_event_or_is_kept_when_nothing_is_left() -> None:
    h = Harness({p: Pool(CHUNK) for p in ("int4", "int8", "bf16")})
    h.budget = RetryBudget(ratio=0.0, min_per_window=1, window_s=60)
    walk = h.walk()
    seen = []
    for attempt in walk:
        seen.append((attempt.precision, attempt.guarded, attempt.next))
        async with attempt:
            raise GuardTrip("loop", "sorry. sorry.")
        if attempt.kept is not None:
            break
    # int4 falls back on the one token; int8 is then unguarded in a real run, but a trip
    # it still raises finds no fallback and is served.
    assert seen == [("int4", True, "int8"), ("int8", False, "bf16")]
    assert h.trace.fallbacks == ["int4:loop", "int8:loop:served"]
    assert [(e.precision, e.fallback_precision, e.reason) for e in h.events] == [
        ("int4", "int8", "loop")
    ]
    assert h.events[0].request_id == "c-1" and h.events[0].detail["expects_json"] is False
    assert h.refused("budget") == 1


async def test_an_unguarded_answer_that_fails_a_guard_is_counted_then_served() -> None:
    h = Harness({p: Pool(CHUNK) for p in ("int4", "int8", "bf16")})
    attempts = list(h.walk())
    attempts[2].served(GuardTrip("json_invalid_char"))
    assert h.metrics.value("quantdrift_gateway_final_guard_failures_total", precision="bf16") == 1
    attempts[0].served(GuardTrip("loop"))  # before the last: the budget was spent
    assert h.refused("budget") == 1
    assert h.trace.fallbacks == ["bf16:json_invalid_char:served", "int4:loop:served"]


async def test_a_client_error_is_not_the_chains_business() -> None:
    pools = {"int4": Pool(UpstreamClientError(400, {"error": {}})), "int8": Pool(CHUNK)}
    h = Harness(pools)
    with pytest.raises(UpstreamClientError):
        await open_chain(h.walk())
    assert pools["int4"].closed == 1 and pools["int8"].calls == []
    assert h.trace.fallbacks == [] and h.fallbacks() == 0
