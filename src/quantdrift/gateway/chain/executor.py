"""The fallback executor: run a Plan along its precision chain, with the guards.

Every upstream call streams. Per attempt, each choice has a ``JsonGuard`` (when
the request asked for JSON) and a ``DegenerationProbe``; the moment one fails,
the upstream stream is cut and the request moves to the next precision of the
chain, silently (a ``DegradationEvent`` records it). Upstream failures move the
same way. The chain is walked by ``attempts.Walk``, the one walker that buffered,
streamed and text completions share. Guarded, and not:

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

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from quantdrift.detectors.json_contract import check_json_contract
from quantdrift.errors import GatewayOverloaded, UpstreamError
from quantdrift.gateway.chain.attempts import (
    Attempt,
    Chained,
    Degradations,
    GuardTrip,
    Trace,
    Walk,
)
from quantdrift.gateway.chain.planning import Plan
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.guards.capacity import RetryBudget
from quantdrift.gateway.guards.degeneration import DegenerationProbe
from quantdrift.gateway.guards.json_guard import JsonGuard, guard_for
from quantdrift.gateway.openai_wire import (
    DONE,
    STOPPED_MID_STREAM,
    Accumulator,
    Completion,
    client_chunk,
    sse,
    usage_chunk,
)
from quantdrift.gateway.telemetry import Telemetry
from quantdrift.gateway.upstream.pools import Upstreams, error_reason

CHAT_PATH = "/v1/chat/completions"


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


@dataclass(slots=True)
class FallbackExecutor:
    """Runs plans; owns nothing but references to the pools, budget and telemetry."""

    config: GatewayConfig
    upstreams: Upstreams
    metrics: Telemetry
    degradations: Degradations
    budget: RetryBudget
    clock: Callable[[], float] = time.monotonic

    def walk(self, plan: Chained, trace: Trace, path: str = CHAT_PATH) -> Walk:
        """The chain's one walker, for a chat plan or (``path``) a text completion's."""
        return Walk(
            plan,
            trace,
            self.upstreams,
            self.budget,
            self.metrics,
            self.degradations,
            self.config.timeouts.total_s,
            path,
            self.clock,
        )

    def _attempt_state(self, plan: Plan, attempt: Attempt) -> tuple[_Guards, Accumulator]:
        """Fresh guards and a fresh accumulator for one precision's answer."""
        acc = Accumulator(
            attempt.precision,
            keep_logprobs=self.config.limits.max_logprob_tokens,
            all_choices=plan.user_logprobs,
        )
        return _Guards(plan, self.config), acc

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
        self, plan: Plan, acc: Accumulator, guards: _Guards, trace: Trace, attempt: Attempt
    ) -> dict[int, str]:
        """An unguarded answer (the chain's last, or the budget spent): counted, not acted on."""
        for index in list(guards.by_index):
            guard, _ = guards.of(index)
            if guard is not None and acc.text(index):
                guard.feed(acc.text(index))
        try:
            return self._close(plan, acc, guards, trace, json=True)
        except GuardTrip as trip:
            attempt.served(trip)
            return {i: acc.text(i) for i in {*guards.by_index, 0}}

    # -- buffered (non-stream, or JSON) ----------------------------------------------------

    async def buffered(self, plan: Plan, trace: Trace) -> tuple[Completion, dict[int, str]]:
        """The first answer along the chain that passes the guards (or the last one)."""
        walk = self.walk(plan, trace)
        for attempt in walk:
            guards, acc = self._attempt_state(plan, attempt)
            async with attempt as stream:
                async for chunk in stream:
                    for d in acc.add(chunk):
                        if attempt.guarded:
                            guards.check(d.index, d.text, d.tops, json=True)
                        else:
                            guards.of(d.index)
                acc.finish()
                if not attempt.guarded:
                    return acc.completion, self._final(plan, acc, guards, trace, attempt)
                return acc.completion, self._close(plan, acc, guards, trace, json=True)
            if attempt.kept is not None:
                # Budget spent: this answer is the answer, as the last one would be.
                acc.finish()
                return acc.completion, {c.index: c.text for c in acc.completion.choices}
        raise walk.failure

    # -- streaming free text --------------------------------------------------------------

    async def open_stream(self, plan: Plan, trace: Trace) -> StreamStart:
        """Run the chain until one precision got past the hold-back; its stream continues."""
        holdback = self.config.stream_holdback_tokens
        walk = self.walk(plan, trace)
        for attempt in walk:
            guards, acc = self._attempt_state(plan, attempt)
            held: list[dict[str, Any]] = []
            async with attempt as stream:
                done = False
                while acc.content_chunks < holdback or (holdback == 0 and not held):
                    try:
                        chunk = await anext(stream)
                    except StopAsyncIteration:
                        done = True
                        break
                    held.append(chunk)
                    for d in acc.add(chunk):
                        if attempt.guarded:
                            guards.check(d.index, d.text, d.tops, json=False)
                if done and attempt.guarded:
                    for index in list(guards.by_index):
                        _, probe = guards.of(index)
                        if probe.finish():
                            raise GuardTrip(str(probe.reason), probe.detail)
                return StreamStart(
                    attempt.precision, acc, guards, held, stream, done, attempt.guarded
                )
            if attempt.kept is not None:
                # Budget spent: re-run nothing; serve what was held, then stop.
                return StreamStart(attempt.precision, acc, guards, held, _empty(), True, False)
        raise walk.failure

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
        except (UpstreamError, GatewayOverloaded) as exc:
            left = False
            reason = error_reason(exc) if isinstance(exc, UpstreamError) else "overloaded"
            self.metrics.stream_errors.labels(plan.route, precision, reason).inc()
            self.metrics.requests.labels(plan.route, precision, "stream_error").inc()
            yield STOPPED_MID_STREAM
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
    "CHAT_PATH",
    "FallbackExecutor",
    "StreamStart",
    "stop_chunk",
]
