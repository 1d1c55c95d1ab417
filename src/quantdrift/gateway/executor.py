"""The fallback executor: run a Plan along its precision chain, with the guards.

Every upstream call streams. Per attempt, each choice has a ``JsonGuard`` (when
the request asked for JSON) and a ``DegenerationProbe``; the moment one fails,
the upstream stream is cut and the request moves to the next precision of the
chain, silently (a ``DegradationEvent`` records it). Upstream failures move the
same way. Guarded, and not:

* the last precision of the chain is never cut: its answer is the best there is;
* a fallback takes one token from the **retry budget**; when the budget is spent
  the current precision is treated as the last (its answer is served, counted in
  ``fallbacks_refused_total{reason="budget"}``), and an upstream failure is
  returned to the user instead of landing on the reference;
* the whole chain shares **one deadline** (``timeouts.chain_s``): each attempt
  gets what is left, never a fresh ``total_s``;
* a JSON answer that stopped because of ``max_tokens`` (``finish_reason:
  length``) and so cannot close is **truncated, not broken**: it is served as the
  model gave it, with ``finish_reason: length`` and ``x-quantdrift-truncated``,
  and not retried on a precision with the same limit (it would be cut too).

A streamed JSON answer is buffered until complete and valid, then replayed as a
clean stream. A streamed free-text answer is held back for its first
``stream_holdback_tokens`` content chunks, then forwarded as it comes; a loop
detected after that stops it with ``finish_reason: length``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from quantdrift.detectors.json_contract import check_json_contract
from quantdrift.errors import UpstreamError, UpstreamTimeout
from quantdrift.gateway.capacity import RetryBudget
from quantdrift.gateway.degeneration import DegenerationProbe
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.json_guard import JsonGuard, guard_for
from quantdrift.gateway.openai_wire import (
    DONE,
    Accumulator,
    Completion,
    client_chunk,
    error_body,
    sse,
    usage_chunk,
)
from quantdrift.gateway.planning import JsonSpec, Plan
from quantdrift.gateway.telemetry import Telemetry
from quantdrift.gateway.upstreams import Upstreams, error_reason
from quantdrift.schemas.degradation import DegradationEvent

log = logging.getLogger(__name__)


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


class Degradations:
    """Where DegradationEvents go (a publisher's non-blocking ``send``), or nowhere."""

    def __init__(self, send: Callable[[DegradationEvent], Any] | None) -> None:
        self._send = send

    def record(
        self,
        plan: Plan,
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
                        "expects_json": plan.spec is not None,
                        "client_request_id": (plan.client_request_id or "")[:128] or None,
                    },
                )
            )
        except Exception:  # never fail the user's request over a telemetry event
            log.exception("degradation event not recorded")


@dataclass(slots=True)
class _Guards:
    """One JSON guard (maybe) and one degeneration probe per choice index."""

    plan: Plan
    config: GatewayConfig
    by_index: dict[int, tuple[JsonGuard | None, DegenerationProbe]] = field(default_factory=dict)

    def of(self, index: int) -> tuple[JsonGuard | None, DegenerationProbe]:
        got = self.by_index.get(index)
        if got is None:
            spec = self.plan.spec
            guard = None
            if spec is not None:
                jg = self.config.json_guard
                guard = guard_for(
                    expected_keys=spec.expected_keys,
                    json_schema=spec.schema,
                    max_whitespace_run=jg.max_whitespace_run,
                    max_depth=jg.max_depth,
                )
                guard.require_object = guard.require_object or spec.require_object
            probe = DegenerationProbe(self.config.degeneration, structured=spec is not None)
            got = self.by_index[index] = (guard, probe)
        return got

    def check(self, index: int, delta: str, tops: list[dict[str, float]], json: bool) -> None:
        """Feed one delta; GuardTrip when a guard fails."""
        guard, probe = self.of(index)
        if json and guard is not None and delta:
            result = guard.feed(delta)
            if not result.ok:
                raise GuardTrip(f"json_{result.reason}", result.detail, result.position)
        if probe.update(delta, tops):
            raise GuardTrip(str(probe.reason), probe.detail)


class FallbackExecutor:
    """Runs plans; owns nothing but references to the pools, budget and telemetry."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Upstreams,
        telemetry: Telemetry,
        degradations: Degradations,
        budget: RetryBudget,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.metrics = telemetry
        self.degradations = degradations
        self.budget = budget
        self.clock = clock

    # -- chain bookkeeping -------------------------------------------------------------

    def _remaining(self, trace: Trace) -> float:
        left = trace.deadline - self.clock()
        if left <= 0:
            raise ChainDeadline("the request's deadline passed")
        return min(self.config.timeouts.total_s, left)

    def _enforce(self, plan: Plan, trace: Trace, i: int) -> bool:
        """Whether attempt ``i`` is guarded: not the chain's last, and a fallback would fit.

        With the retry budget spent (or the chain's deadline past) this attempt is
        the last one: its answer is served whole, as the chain's last would be,
        rather than cut by a guard with nowhere to go.
        """
        if i >= len(plan.decision.chain) - 1:
            return False
        now = self.clock()
        return now < trace.deadline and self.budget.available(now)

    def _take_fallback(self, plan: Plan, trace: Trace, why: str) -> bool:
        if trace.deadline - self.clock() <= 0:
            self.metrics.fallbacks_refused.labels(plan.route, "deadline").inc()
            return False
        if not self.budget.try_fallback(self.clock()):
            self.metrics.fallbacks_refused.labels(plan.route, "budget").inc()
            log.warning("route %s: fallback (%s) refused, retry budget spent", plan.route, why)
            return False
        return True

    def _fallback(self, plan: Plan, trace: Trace, precision: str, reason: str, trip: Any) -> None:
        trace.fallbacks.append(f"{precision}:{reason}")
        self.metrics.fallbacks.labels(plan.route, precision, reason).inc()
        if trip is not None:
            chain = plan.decision.chain
            at = chain.index(precision) if precision in chain else -1
            nxt = chain[at + 1] if 0 <= at < len(chain) - 1 else None
            self.degradations.record(plan, precision, nxt, trip, after_flush=False)

    def _upstream_failed(self, plan: Plan, trace: Trace, precision: str, exc: UpstreamError):  # type: ignore[no-untyped-def]
        trace.upstream_errors += 1
        if isinstance(exc, UpstreamTimeout):
            trace.timeouts += 1
        reason = f"upstream_{error_reason(exc)}"
        log.warning("route %s: %s failed (%s): %s", plan.route, precision, reason, exc)
        self._fallback(plan, trace, precision, reason, None)

    def _close(
        self, plan: Plan, acc: Accumulator, guards: _Guards, trace: Trace, json: bool
    ) -> dict[int, str]:
        """End-of-stream checks per choice; the text each choice gives the user."""
        texts: dict[int, str] = {}
        completion = acc.completion
        for index in sorted({*guards.by_index, 0}):
            text = acc.text(index)
            guard, probe = guards.of(index)
            if probe.finish():
                raise GuardTrip(str(probe.reason), probe.detail)
            if not json or guard is None or plan.spec is None:
                texts[index] = text
                continue
            result = guard.close()
            if not result.ok:
                if completion.choice(index).finish_reason == "length":
                    # Cut by max_tokens: a same-limit retry would be cut too. Serve as is.
                    trace.truncated = True
                    self.metrics.truncated.labels(plan.route, completion.precision, "true").inc()
                    texts[index] = text
                    continue
                raise GuardTrip(f"json_{result.reason}", result.detail, result.position)
            span = guard.span
            value = text[span[0] : span[1]] if span else text
            if plan.spec.schema is not None:
                ok, error = check_json_contract(value, plan.spec.info())
                if ok is False:
                    raise GuardTrip("json_schema", error or "")
            texts[index] = value
        return texts

    def _final(
        self, plan: Plan, acc: Accumulator, guards: _Guards, trace: Trace, last: bool = True
    ) -> dict[int, str]:
        """An unguarded answer (the chain's last, or the budget spent): counted, not acted on."""
        for index in list(guards.by_index):
            guard, _ = guards.of(index)
            if guard is not None and acc.text(index):
                guard.feed(acc.text(index))
        try:
            return self._close(plan, acc, guards, trace, json=True)
        except GuardTrip as trip:
            precision = acc.completion.precision
            if last:
                self.metrics.final_guard_failures.labels(plan.route, precision, trip.reason).inc()
            else:
                self.metrics.fallbacks_refused.labels(plan.route, "budget").inc()
            trace.fallbacks.append(f"{precision}:{trip.reason}:served")
            return {i: acc.text(i) for i in {*guards.by_index, 0}}

    # -- buffered (non-stream, or JSON) ----------------------------------------------------

    async def buffered(self, plan: Plan, trace: Trace) -> tuple[Completion, dict[int, str]]:
        """The first answer along the chain that passes the guards (or the last one)."""
        chain = plan.decision.chain
        last: UpstreamError | None = None
        for i, precision in enumerate(chain):
            enforce = self._enforce(plan, trace, i)
            guards = _Guards(plan, self.config)
            acc = Accumulator(
                precision,
                keep_logprobs=self.config.limits.max_logprob_tokens,
                all_choices=plan.user_logprobs,
            )
            trace.attempt_t0 = self.clock()
            try:
                stream = self.upstreams[precision].stream(plan.body, total_s=self._remaining(trace))
                async with contextlib.aclosing(stream):
                    async for chunk in stream:
                        for d in acc.add(chunk):
                            if enforce:
                                guards.check(d.index, d.text, d.tops, json=True)
                            else:
                                guards.of(d.index)
                acc.finish()
                if not enforce:
                    is_last = i == len(chain) - 1
                    return acc.completion, self._final(plan, acc, guards, trace, is_last)
                return acc.completion, self._close(plan, acc, guards, trace, json=True)
            except GuardTrip as trip:
                if not self._take_fallback(plan, trace, trip.reason):
                    # Budget spent: this answer is the answer, as the last one would be.
                    acc.finish()
                    trace.fallbacks.append(f"{precision}:{trip.reason}:served")
                    return acc.completion, {c.index: c.text for c in acc.completion.choices}
                self._fallback(plan, trace, precision, trip.reason, trip)
            except UpstreamError as exc:
                last = exc
                if isinstance(exc, ChainDeadline):
                    raise
                self._upstream_failed(plan, trace, precision, exc)
                if i < len(chain) - 1 and not self._take_fallback(plan, trace, "upstream"):
                    raise
        assert last is not None  # the last precision never trips a guard
        raise last

    # -- streaming free text --------------------------------------------------------------

    async def open_stream(self, plan: Plan, trace: Trace) -> StreamStart:
        """Run the chain until one precision got past the hold-back; its stream continues."""
        chain = plan.decision.chain
        holdback = self.config.stream_holdback_tokens
        last: UpstreamError | None = None
        for i, precision in enumerate(chain):
            enforce = self._enforce(plan, trace, i)
            guards = _Guards(plan, self.config)
            acc = Accumulator(
                precision,
                keep_logprobs=self.config.limits.max_logprob_tokens,
                all_choices=plan.user_logprobs,
            )
            trace.attempt_t0 = self.clock()
            stream = self.upstreams[precision].stream(plan.body, total_s=self._remaining(trace))
            held: list[dict[str, Any]] = []
            done = False
            try:
                while acc.content_chunks < holdback or (holdback == 0 and not held):
                    try:
                        chunk = await anext(stream)
                    except StopAsyncIteration:
                        done = True
                        break
                    held.append(chunk)
                    for d in acc.add(chunk):
                        if enforce:
                            guards.check(d.index, d.text, d.tops, json=False)
                if done and enforce:
                    for index in list(guards.by_index):
                        _, probe = guards.of(index)
                        if probe.finish():
                            raise GuardTrip(str(probe.reason), probe.detail)
            except GuardTrip as trip:
                await stream.aclose()
                if not self._take_fallback(plan, trace, trip.reason):
                    trace.fallbacks.append(f"{precision}:{trip.reason}:served")
                    # Budget spent: re-run nothing; serve what was held, then stop.
                    return StreamStart(precision, acc, guards, held, _empty(), True, False)
                self._fallback(plan, trace, precision, trip.reason, trip)
                continue
            except UpstreamError as exc:
                await stream.aclose()
                last = exc
                if isinstance(exc, ChainDeadline):
                    raise
                self._upstream_failed(plan, trace, precision, exc)
                if i < len(chain) - 1 and not self._take_fallback(plan, trace, "upstream"):
                    raise
                continue
            except BaseException:
                await stream.aclose()
                raise
            return StreamStart(precision, acc, guards, held, stream, done, enforce)
        assert last is not None
        raise last

    async def forward(
        self,
        plan: Plan,
        trace: Trace,
        start: StreamStart,
        on_complete: Callable[[Completion], None],
    ) -> AsyncIterator[bytes]:
        """Send the held chunks, then the rest of the stream; usage last when asked."""
        completed = False
        left = True  # until the loop ends or the upstream fails: the client went away
        acc, stream, precision = start.acc, start.stream, start.precision
        try:
            for chunk in start.held:
                out = self._client_bytes(plan, trace, chunk)
                if out:
                    yield out
            if not start.done:
                async for chunk in stream:
                    cut = None
                    for d in acc.add(chunk):
                        if start.enforce:
                            _, probe = start.guards.of(d.index)
                            if probe.update(d.text, d.tops):
                                cut = probe
                    if cut is not None:
                        # The user has seen the start: stop the loop here, say so, record it.
                        self.metrics.stream_cuts.labels(plan.route, precision, cut.reason).inc()
                        self.degradations.record(
                            plan, precision, None, GuardTrip(str(cut.reason), cut.detail), True
                        )
                        stop = stop_chunk(chunk, sorted(start.guards.by_index) or [0])
                        yield sse(stop)
                        break
                    out = self._client_bytes(plan, trace, chunk)
                    if out:
                        yield out
            completed, left = True, False
        except UpstreamError as exc:
            left = False
            self.metrics.stream_errors.labels(plan.route, precision, error_reason(exc)).inc()
            self.metrics.requests.labels(plan.route, precision, "stream_error").inc()
            yield sse(
                error_body(
                    "The model stopped answering mid-stream",
                    "upstream_error",
                    "upstream_disconnected",
                )
            )
        finally:
            await stream.aclose()
            if left:
                self.metrics.client_disconnects.labels(plan.route).inc()
        finish = acc.finish()
        if plan.include_usage:
            yield usage_chunk(
                {
                    "id": finish.id,
                    "object": "chat.completion.chunk",
                    "created": finish.created,
                    "model": finish.model,
                },
                finish.usage,
            )
        yield DONE
        if completed:
            on_complete(finish)

    def _client_bytes(self, plan: Plan, trace: Trace, chunk: dict[str, Any]) -> bytes | None:
        out = client_chunk(chunk, plan.user_logprobs, plan.user_top_logprobs)
        if not out.get("choices"):
            return None  # the upstream's usage chunk: ours comes at the end, when asked
        if trace.first_token_at is None and any(
            isinstance(c, dict) and (c.get("delta") or {}).get("content") for c in out["choices"]
        ):
            trace.first_token_at = self.clock()
        return sse(out)


def stop_chunk(chunk: dict[str, Any], indexes: list[int]) -> dict[str, Any]:
    """A chunk ending every choice with ``finish_reason: length`` (a stream cut by a guard)."""
    head: dict[str, Any] = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
    finish: dict[str, Any] = {"delta": {}, "logprobs": None, "finish_reason": "length"}
    return {**head, "choices": [{"index": i, **finish} for i in indexes]}


async def _empty() -> AsyncGenerator[dict[str, Any], None]:
    return
    yield {}


@dataclass(slots=True)
class StreamStart:
    """A stream past its hold-back: what was held, and the live upstream stream."""

    precision: str
    acc: Accumulator
    guards: _Guards
    held: list[dict[str, Any]]
    stream: AsyncGenerator[dict[str, Any], None]
    done: bool
    enforce: bool


__all__ = [
    "ChainDeadline",
    "Degradations",
    "FallbackExecutor",
    "GuardTrip",
    "JsonSpec",
    "StreamStart",
    "Trace",
]
