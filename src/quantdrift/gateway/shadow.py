"""The shadow runner: mirror sampled requests to the other side, isolated from users.

Isolation, piece by piece:

* its own ``Upstreams`` (own clients, ``shadow_max_connections`` per pool),
  so a shadow call never takes a user's connection, and a slow reference that
  fills the shadow pool cannot queue users behind it;
* a bounded queue (``shadow_queue``, a few hundred) that drops the **oldest**
  job when full: the newest requests are the ones worth mirroring, and memory
  stays flat whatever the reference does; every drop is counted by reason;
* queued jobs hold the user's answer **stripped** (choice 0, top-k log-probs
  the pair needs), not the full upstream payload, and the request body only when
  it is at most ``limits.max_shadow_body_bytes`` (larger ones are not mirrored,
  counted ``too_large``): the queue holds at most ``shadow_queue`` such bodies;
* ``shadow_concurrency`` workers, each job under one deadline
  (``timeouts.shadow_total_s``, 30 s by default);
* the route's state is **re-checked before each call**: a candidate rolled back
  while the job waited is not called;
* nothing here runs on a user's request path: ``submit`` only appends to a
  deque, and every failure stays in this module (counted, logged).

Two callers, one pair builder. The gateway submits a job with the answer its user
got (that side is not asked again); the collector (``collector.py``), behind a
gateway it does not own, submits a job with no answer, and the runner asks both
sides itself.

Three rooms. This module is the lifecycle and the calls (queue, workers, deadlines,
drops); ``shadow_pairs.py`` is the pure half (the suspension check through
``planning.route_decision``, the calls' body, the pair, its privacy and sample rate);
``pool_probe.py`` reads what serves each pool. Every call is metered in
``shadow_spend.py``, apart from user traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from quantdrift.errors import GatewayOverloaded, UpstreamError
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.openai_wire import Accumulator, Completion
from quantdrift.gateway.planning import Plan
from quantdrift.gateway.pool_probe import PoolProbe
from quantdrift.gateway.routing import RouteDirective
from quantdrift.gateway.shadow_pairs import (
    build_pair,
    candidate_suspended,
    pair_rate,
    shadow_body,
    side_of,
)
from quantdrift.gateway.shadow_spend import SpendMeter
from quantdrift.gateway.teacher_forcing import Failed, Scored
from quantdrift.gateway.telemetry import counter, gauge
from quantdrift.gateway.upstreams import UpstreamClientError, Upstreams, error_reason
from quantdrift.schemas.pair import PairEvent
from quantdrift.supervision import Supervisor, cancelled

log = logging.getLogger(__name__)

# Drop reasons (quantdrift_gateway_shadow_dropped_total{stage="queue",reason}).
QUEUE_FULL = "queue_full"
ROLLED_BACK = "route_rolled_back"
DEADLINE = "deadline"
STOPPED = "stopped"
STOPPED_IN_FLIGHT = "stopped_in_flight"
TOO_LARGE = "too_large"  # request body past limits.max_shadow_body_bytes: not mirrored


def _no_cap(_route: str) -> float | None:
    return None


@dataclass(frozen=True, slots=True)
class ShadowJob:
    plan: Plan
    user: Completion | None  # stripped: only what the pair needs; None: ask both sides
    queued_at: float


class ShadowRunner:
    """Queue, workers and upstream calls for shadow and noise pairs (module docstring)."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Upstreams,
        offer: Callable[[PairEvent], Any] | None,
        directive_of: Callable[[str], RouteDirective | None],
        *,
        prompt_salt: str,
        clock: Callable[[], float] = time.monotonic,
        mirrored_share: float = 1.0,
        cap_of: Callable[[str], float | None] = _no_cap,
    ) -> None:
        if not 0.0 < mirrored_share <= 1.0:
            raise ValueError(f"mirrored_share must be in (0, 1], got {mirrored_share}")
        self.config = config
        self.mirrored_share = mirrored_share
        self.upstreams = upstreams
        self._offer = offer
        self._directive_of = directive_of
        self._cap_of = cap_of
        self._salt = prompt_salt
        self._clock = clock
        self._queue: deque[ShadowJob] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task[None]] = []
        self.in_flight = 0
        self.dropped: dict[str, int] = {}
        self.errors: dict[tuple[str, str, str], int] = {}
        self.offered = 0
        self._closed = False
        # Restarts a worker loop that raises; the gateway shares its own.
        self.supervisor = Supervisor()
        self._tf_logged: set[tuple[str, str]] = set()
        self.probe = PoolProbe(config, upstreams)
        self.spend = SpendMeter()
        self._probe_task: asyncio.Task[None] | None = None

    # -- the user's side: never blocks, never raises --------------------------------

    def admit(self, plan: Plan, body_bytes: int) -> Plan:
        """The plan as the runner may take it: a sampled request whose body is past
        ``limits.max_shadow_body_bytes`` is not mirrored (counted ``too_large``), so the
        queue's memory stays within ``shadow_queue`` x ``max_shadow_body_bytes``."""
        if (plan.shadow or plan.noise) and body_bytes > self.config.limits.max_shadow_body_bytes:
            self._drop(TOO_LARGE)
            return dataclasses.replace(plan, shadow=False, noise=False)
        return plan

    def submit(self, plan: Plan, user: Completion | None) -> None:
        """Queue one job; the oldest is dropped (and counted) when the queue is full.

        ``user``: the answer the user got (that side is not asked again), or None when
        the caller served no one (the collector): both sides are asked.
        """
        try:
            if self._closed:
                self._drop(STOPPED)
                return
            if len(self._queue) >= self.config.shadow_queue:
                self._queue.popleft()
                self._drop(QUEUE_FULL)
            kept = None if user is None else user.stripped(self.config.top_logprobs)
            self._queue.append(ShadowJob(plan, kept, self._clock()))
            self._idle.clear()
            self._wake.set()
        except Exception:  # the user's request must not fail because of the mirror
            log.exception("shadow job not queued")

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _error(self, route: str, kind: str, reason: str) -> None:
        key = (route, kind, reason)
        self.errors[key] = self.errors.get(key, 0) + 1

    @property
    def depth(self) -> int:
        return len(self._queue)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self._probe_task is None:
            self._probe_task = asyncio.create_task(self.probe.loop(), name="quantdrift-probe")
        if not self._workers:
            self._closed = False
            self._workers = [
                self.supervisor.spawn(f"shadow-worker-{i}", self._work)
                for i in range(self.config.shadow_concurrency)
            ]

    async def wait_idle(self, timeout: float) -> bool:
        """True once the queue is empty and no job runs (tests, shutdown)."""
        try:
            async with asyncio.timeout(timeout):
                while self._queue or self.in_flight:
                    self._idle.clear()
                    await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self, timeout: float = 5.0) -> None:
        """Refuse new jobs, let queued and running ones finish for ``timeout`` s, then
        cancel the rest: each counted (``stopped`` queued, ``stopped_in_flight``
        running) and reported in one log line."""
        self._closed = True
        await cancelled(self._probe_task)
        self._probe_task = None
        drained = await self.wait_idle(timeout)
        running, queued = self.in_flight, len(self._queue)
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers = []
        if queued:
            self.dropped[STOPPED] = self.dropped.get(STOPPED, 0) + queued
            self._queue.clear()
        if running:
            self.dropped[STOPPED_IN_FLIGHT] = self.dropped.get(STOPPED_IN_FLIGHT, 0) + running
        if not drained:
            log.warning(
                "shadow runner stopped after %.1f s of draining: %d queued and %d running "
                "jobs dropped (quantdrift_gateway_shadow_dropped_total)",
                timeout,
                queued,
                running,
            )
        await self.upstreams.aclose()

    async def _work(self) -> None:
        while True:
            if not self._queue:
                if not self.in_flight:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            job = self._queue.popleft()
            self.in_flight += 1
            try:
                await self._run(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in pair building must stay here
                log.exception("shadow job failed")
                self._error(job.plan.route, "shadow", "bug")
            finally:
                self.in_flight -= 1
                if not self._queue and not self.in_flight:
                    self._idle.set()

    # -- one job: the calls (what the pair says is shadow_pairs.py's) ------------------

    async def _run(self, job: ShadowJob) -> None:
        plan = job.plan
        cache: dict[str, Completion] = {} if job.user is None else {job.user.precision: job.user}
        try:
            async with asyncio.timeout(self.config.timeouts.shadow_total_s):
                for kind, wanted in (("shadow", plan.shadow), ("noise", plan.noise)):
                    if wanted:
                        await self._pair(kind, plan, cache)
        except TimeoutError:
            self._drop(DEADLINE)
            self._error(plan.route, "shadow", "deadline")

    async def _pair(self, kind: str, plan: Plan, cache: dict[str, Completion]) -> None:
        try:
            pair = await (
                self._shadow_pair(plan, cache)
                if kind == "shadow"
                else self._noise_pair(plan, cache)
            )
        except UpstreamError as exc:
            self._error(plan.route, kind, f"upstream_{error_reason(exc)}")
            return
        except GatewayOverloaded:
            self._error(plan.route, kind, "overloaded")
            return
        except UpstreamClientError:
            self._error(plan.route, kind, "upstream_rejected")
            return
        if pair is None:
            return
        if self._offer is None:
            self._error(plan.route, kind, "no_publisher")
            return
        self.offered += 1
        self._offer(pair)

    async def _collect(self, plan: Plan, purpose: str, precision: str) -> Completion:
        """One shadow call, metered (``shadow_spend.py``) whatever its end."""
        acc = Accumulator(precision, keep_logprobs=self.config.limits.max_logprob_tokens)
        body = shadow_body(self.config, plan)
        stream = self.upstreams[precision].stream(body, total_s=self.config.timeouts.shadow_total_s)
        started, done = self._clock(), None
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    acc.add(chunk)
            done = acc.finish().stripped(self.config.top_logprobs)
            return done
        finally:
            side = side_of(self.config, plan.route, precision)
            self.spend.answer(plan.route, side, purpose, self._clock() - started, done)

    async def _shadow_pair(self, plan: Plan, cache: dict[str, Completion]) -> PairEvent | None:
        d = plan.decision
        if d.pair_candidate is None:
            return None
        for precision in (d.pair_candidate, d.pair_reference):
            if precision in cache:
                continue
            if precision == d.pair_candidate and candidate_suspended(
                self.config, plan, self._directive_of, self._cap_of
            ):
                self._drop(ROLLED_BACK)
                return None
            cache[precision] = await self._collect(plan, "shadow", precision)
        cand, ref = cache[d.pair_candidate], cache[d.pair_reference]
        tf = None
        if self.config.routes[plan.route].teacher_forced and cand.text:
            tf = await self._teacher_forced(plan, d.pair_reference, cand)
        return self._build(plan, "shadow", (cand, ref), tf)

    async def _teacher_forced(
        self, plan: Plan, reference: str, cand: Completion
    ) -> list[float] | None:
        """The reference's log-probs of the candidate's tokens, or None: every None is
        counted (``shadow_errors{reason="tf_..."}``), and logged once per pool and reason.
        The pass is metered as ``teacher_forcing`` spend, failed or not."""
        started, outcome = self._clock(), None
        try:
            outcome = await self.upstreams[reference].score(
                plan.body.get("messages"), cand, timeout_s=self.config.timeouts.shadow_total_s
            )
        finally:
            side = side_of(self.config, plan.route, reference)
            self.spend.forced(plan.route, side, self._clock() - started, outcome)
        if outcome is None:
            return None
        if isinstance(outcome, Scored):
            return outcome.logprobs
        self._error(plan.route, "shadow", f"tf_{outcome.reason}")
        if (reference, outcome.reason) not in self._tf_logged:
            self._tf_logged.add((reference, outcome.reason))
            _log_tf_failure(self.config.pool(reference).teacher_forcing, reference, outcome)
        return None

    async def _noise_pair(self, plan: Plan, cache: dict[str, Completion]) -> PairEvent:
        ref = plan.decision.pair_reference
        if ref not in cache:
            cache[ref] = await self._collect(plan, "noise", ref)
        # The second run uses the same decoding as the first: a greedy request's noise
        # pair must measure greedy-vs-greedy disagreement (batching nondeterminism on
        # GPU servers), never a sampled run labelled greedy. Where two greedy runs are
        # identical the floor drops the pair and the blessed baseline stands in.
        second = await self._collect(plan, "noise", ref)
        return self._build(plan, "noise", (cache[ref], second), None)

    def _build(
        self, plan: Plan, kind: str, sides: tuple[Completion, Completion], tf: list[float] | None
    ) -> PairEvent:
        return build_pair(
            self.config,
            plan,
            kind,
            sides,
            tf,
            rate=pair_rate(self.config, plan.route, kind, self.mirrored_share),
            salt=self._salt,
            identities=self.probe.identities,
            ts=time.time(),
        )

    # -- metrics -------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        yield counter(
            "shadow_errors",
            "shadow calls or pairs that failed",
            ["route", "kind", "reason"],
            self.errors,
        )
        yield from self.probe.collect()
        yield from self.spend.collect()
        yield gauge("shadow_queue_depth", "shadow jobs waiting", [], {(): len(self._queue)})
        yield gauge("shadow_in_flight", "shadow jobs running", [], {(): self.in_flight})
        yield gauge(
            "shadow_queue_capacity", "shadow queue size", [], {(): self.config.shadow_queue}
        )


def _log_tf_failure(mode: str, reference: str, outcome: Failed) -> None:
    """Once per pool and reason (the runner keeps which): pairs go without tf_kl."""
    log.error(
        "teacher forcing (%s) on reference pool %s failed: %s: %s; pairs go without "
        'tf_kl (counted in quantdrift_gateway_shadow_errors_total{reason="tf_%s"}; '
        "logged once per pool and reason)",
        mode,
        reference,
        outcome.reason,
        outcome.detail,
        outcome.reason,
    )
