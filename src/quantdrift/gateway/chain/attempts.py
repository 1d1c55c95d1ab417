"""One walk down a request's precision chain: its deadline, its retry budget, its records.

Buffered chat, streamed chat and text completions all go down the chain through
``Walk``; no other code catches an upstream error or a guard's trip to decide
whether the request falls back. A caller writes one attempt and lets the walk
decide what happens when it fails::

    walk = executor.walk(plan, trace)
    for attempt in walk:               # one Attempt per precision, while the chain goes on
        async with attempt as stream:  # the upstream stream, with what is left of the time
            ...                        # read it; a guard raises GuardTrip
            return answer
        if attempt.kept is not None:   # a guard tripped with no fallback left: serve it
            return what_was_read
    raise walk.failure                 # only an empty chain ends here

What the walk guarantees (the rules themselves are the pure functions below,
tested as a table in ``tests/unit/test_gateway_attempts.py``):

* **one deadline** (``timeouts.chain_s``) for the whole chain: each attempt gets
  what is left of it, capped by ``timeouts.total_s``, never a fresh ``total_s``;
  an attempt that would start past it raises ``ChainDeadline``;
* an attempt is **guarded** (a guard may cut it) only when it is not the chain's
  last, time is left, and a fallback would fit the retry budget: the last
  precision is never cut, its answer is the best there is;
* a fallback takes one token from the **retry budget**. When the budget is spent
  (or the deadline passed) a guard's trip serves the answer it cut (``:served``),
  and an upstream failure ends the chain instead of landing on the reference;
* every upstream failure is recorded as a fallback by reason
  (``upstream_timeout``, ``upstream_http_500``, ...), the chain's last too, and
  every fallback not taken is counted in ``fallbacks_refused_total{reason}``;
  a guard's trip that falls back also sends a ``DegradationEvent``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol

from quantdrift.errors import UpstreamError, UpstreamTimeout
from quantdrift.gateway.chain.routing import Decision
from quantdrift.gateway.guards.capacity import RetryBudget
from quantdrift.gateway.telemetry import Telemetry
from quantdrift.gateway.upstream.pools import Upstreams, error_reason
from quantdrift.schemas.degradation import DegradationEvent

log = logging.getLogger(__name__)

Refused = Literal["last", "deadline", "budget"]


class GuardTrip(Exception):
    """A guard cut the stream: ``reason`` like ``json_invalid_char`` or ``loop``."""

    def __init__(self, reason: str, detail: str = "", position: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.position = position


class ChainDeadline(UpstreamTimeout):
    """The request's whole chain ran out of time."""

    reason = "chain_deadline"


@dataclass(slots=True)
class Trace:
    """What happened to one request while it ran (headers, metrics, events)."""

    t0: float
    deadline: float
    fallbacks: list[str] = field(default_factory=list)
    timeouts: int = 0
    upstream_errors: int = 0
    truncated: bool = False
    attempt_t0: float = 0.0
    first_token_at: float | None = None


class Chained(Protocol):
    """What the walk reads of a plan: a chat ``Plan`` or a ``CompletionPlan``."""

    @property
    def route(self) -> str: ...
    @property
    def request_id(self) -> str: ...
    @property
    def client_request_id(self) -> str | None: ...
    @property
    def decision(self) -> Decision: ...
    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def expects_json(self) -> bool: ...


# -- the rules (pure) -------------------------------------------------------------------


def is_last(index: int, length: int) -> bool:
    """Whether attempt ``index`` runs the chain's last precision."""
    return index >= length - 1


def guarded(index: int, length: int, *, left_s: float, budget_left: bool) -> bool:
    """Whether a guard may cut attempt ``index``: a fallback must exist, and be allowed.

    Not the chain's last, time left on the deadline, a token left in the budget.
    Otherwise the attempt is the last one in effect: its answer is served whole, as
    the chain's last would be, rather than cut with nowhere to go.
    """
    return not is_last(index, length) and left_s > 0 and budget_left


def refusal(*, last: bool, left_s: float, take_token: Callable[[], bool]) -> Refused | None:
    """Why a failed attempt may not fall back (``None``: it may, and a token was taken).

    The budget is asked last, so a fallback refused for another reason costs no token.
    """
    if last:
        return "last"
    if left_s <= 0:
        return "deadline"
    if not take_token():
        return "budget"
    return None


def attempt_s(left_s: float, total_s: float) -> float:
    """What one attempt may take: what is left of the chain, never more than ``total_s``."""
    return min(total_s, left_s)


# -- the records ------------------------------------------------------------------------


class Degradations:
    """Where DegradationEvents go (a publisher's non-blocking ``send``), or nowhere."""

    def __init__(self, send: Callable[[DegradationEvent], Any] | None) -> None:
        self._send = send

    def record(
        self,
        plan: Chained,
        precision: str,
        nxt: str | None,
        trip: GuardTrip,
        after_flush: bool,
    ) -> None:
        if self._send is None:
            return
        try:
            self._send(
                DegradationEvent(
                    event_id=uuid.uuid4().hex,
                    route=plan.route,
                    precision=precision,
                    fallback_precision=nxt,
                    reason=trip.reason,
                    ts=time.time(),
                    request_id=plan.request_id[:128],
                    detail={
                        "detail": trip.detail[:300],
                        "position": trip.position,
                        "after_flush": after_flush,
                        "expects_json": plan.expects_json,
                        "client_request_id": (plan.client_request_id or "")[:128] or None,
                    },
                )
            )
        except Exception:  # never fail the user's request over a telemetry event
            log.exception("degradation event not recorded")


# -- the walk ---------------------------------------------------------------------------


Chunks = AsyncGenerator[dict[str, Any], None]


@dataclass(slots=True)
class Attempt:
    """One precision's try: ``async with`` it to get its stream; failures go to the walk."""

    walk: Walk
    index: int
    precision: str
    next: str | None  # the precision a fallback lands on (None: the chain's last)
    guarded: bool
    total_s: float
    kept: GuardTrip | None = None  # a trip with no fallback left: the answer is served
    stream: Chunks | None = None

    @property
    def last(self) -> bool:
        return self.next is None

    async def __aenter__(self) -> Chunks:
        self.walk.trace.attempt_t0 = self.walk.clock()
        self.stream = self.walk.open(self)
        return self.stream

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """Close the stream on any failure; True (swallowed) when the walk goes on or keeps."""
        if exc is None:
            return False  # an answer: its stream is the caller's now
        if self.stream is not None:
            await self.stream.aclose()
        if isinstance(exc, GuardTrip):
            return self.walk.tripped(self, exc)
        if isinstance(exc, UpstreamError):
            return self.walk.failed(self, exc)
        return False  # a client's 4xx, a cancellation, a bug: not the chain's business

    def served(self, trip: GuardTrip) -> None:
        """An unguarded answer failed a guard: counted, served as it is."""
        self.walk.served(self, trip)


@dataclass(slots=True)
class Walk:
    """The attempts of one request along ``plan.decision.chain`` (see the module docstring)."""

    plan: Chained
    trace: Trace
    upstreams: Upstreams
    budget: RetryBudget
    metrics: Telemetry
    degradations: Degradations
    total_s: float
    path: str = "/v1/chat/completions"
    clock: Callable[[], float] = time.monotonic

    def __iter__(self) -> Iterator[Attempt]:
        chain = self.plan.decision.chain
        for i, precision in enumerate(chain):
            now = self.clock()
            left = self.trace.deadline - now
            if left <= 0:
                raise ChainDeadline("the request's deadline passed")
            yield Attempt(
                walk=self,
                index=i,
                precision=precision,
                next=None if is_last(i, len(chain)) else chain[i + 1],
                guarded=guarded(i, len(chain), left_s=left, budget_left=self.budget.available(now)),
                total_s=attempt_s(left, self.total_s),
            )

    @property
    def failure(self) -> UpstreamError:
        """For a chain with no precision (planning makes none): every other walk ends in an
        answer, a kept answer, or the raise of the failure that ended it."""
        return UpstreamError("the chain has no precision")

    def open(self, attempt: Attempt) -> Chunks:
        return self.upstreams[attempt.precision].stream(
            self.plan.body, total_s=attempt.total_s, path=self.path
        )

    def _refusal(self, attempt: Attempt, why: str) -> Refused | None:
        refused = refusal(
            last=attempt.last,
            left_s=self.trace.deadline - self.clock(),
            take_token=lambda: self.budget.try_fallback(self.clock()),
        )
        if refused in ("deadline", "budget"):
            self.metrics.fallbacks_refused.labels(self.plan.route, refused).inc()
        if refused == "budget":
            log.warning("route %s: fallback (%s) refused, retry budget spent", self.plan.route, why)
        return refused

    def _record(self, precision: str, reason: str) -> None:
        self.trace.fallbacks.append(f"{precision}:{reason}")
        self.metrics.fallbacks.labels(self.plan.route, precision, reason).inc()

    def failed(self, attempt: Attempt, exc: UpstreamError) -> bool:
        """An upstream failed: recorded; True when the chain goes on to the next precision."""
        trace = self.trace
        trace.upstream_errors += 1
        if isinstance(exc, UpstreamTimeout):
            trace.timeouts += 1
        reason = f"upstream_{error_reason(exc)}"
        log.warning("route %s: %s failed (%s): %s", self.plan.route, attempt.precision, reason, exc)
        self._record(attempt.precision, reason)
        return self._refusal(attempt, "upstream") is None

    def tripped(self, attempt: Attempt, trip: GuardTrip) -> bool:
        """A guard cut the answer: fall back (recorded, an event sent), or keep it (served)."""
        if self._refusal(attempt, trip.reason) is not None:
            # No fallback left: this answer is the answer, as the last one would be.
            self.trace.fallbacks.append(f"{attempt.precision}:{trip.reason}:served")
            attempt.kept = trip
            return True
        self._record(attempt.precision, trip.reason)
        self.degradations.record(self.plan, attempt.precision, attempt.next, trip, False)
        return True

    def served(self, attempt: Attempt, trip: GuardTrip) -> None:
        precision = attempt.precision
        if attempt.last:
            self.metrics.final_guard_failures.labels(self.plan.route, precision, trip.reason).inc()
        else:  # unguarded before the last means the budget was spent (past the deadline,
            # the attempt would not have started)
            self.metrics.fallbacks_refused.labels(self.plan.route, "budget").inc()
        self.trace.fallbacks.append(f"{precision}:{trip.reason}:served")


__all__ = [
    "Attempt",
    "ChainDeadline",
    "Chained",
    "Chunks",
    "Degradations",
    "GuardTrip",
    "Trace",
    "Walk",
    "attempt_s",
    "guarded",
    "is_last",
    "refusal",
]
