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

Four modules of the shadow room. This one is the lifecycle (queue, workers, start and stop, drops);
``calls.py`` makes one job's calls under its deadline (the other side, noise
runs, teacher forcing, extra candidates: the reference answers once per job);
``pairs.py`` is the pure half (the suspension check through
``planning.route_decision``, the calls' body, the pair, its privacy and sample rate);
``probes.py`` reads what serves each pool. Every call is metered in
``spend.py``, apart from user traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from quantdrift.gateway.chain.planning import Plan
from quantdrift.gateway.chain.routing import RouteDirective
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.openai_wire import Completion
from quantdrift.gateway.shadow.calls import ShadowCalls, ShadowJob, Wiring
from quantdrift.gateway.shadow.probes import PoolProbe
from quantdrift.gateway.shadow.spend import SpendMeter
from quantdrift.gateway.telemetry import counter, gauge
from quantdrift.gateway.upstream.pools import Upstreams
from quantdrift.schemas.pair import PairEvent
from quantdrift.supervision import Supervisor, cancelled

log = logging.getLogger(__name__)

# Drop reasons (quantdrift_gateway_shadow_dropped_total{stage="queue",reason}); a running
# job's own (deadline, route_rolled_back) are calls.py's.
QUEUE_FULL = "queue_full"
STOPPED = "stopped"
STOPPED_IN_FLIGHT = "stopped_in_flight"
TOO_LARGE = "too_large"  # request body past limits.max_shadow_body_bytes: not mirrored


def _no_cap(_route: str) -> float | None:
    return None


class ShadowRunner:
    """Queue, workers, start and stop; each job's calls are ``ShadowCalls``'."""

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
        self._clock = clock
        self._queue: deque[ShadowJob] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task[None]] = []
        self.in_flight = 0
        self.dropped: dict[str, int] = {}
        self.errors: dict[tuple[str, str, str], int] = {}
        self._closed = False
        # Restarts a worker loop that raises; the gateway shares its own.
        self.supervisor = Supervisor()
        self.probe = PoolProbe(config, upstreams)
        self.spend = SpendMeter()
        wiring = Wiring(offer, directive_of, cap_of, prompt_salt, mirrored_share, clock)
        self.calls = ShadowCalls(
            config, upstreams, wiring, self.probe, self.spend, self.dropped, self.errors
        )
        self._probe_task: asyncio.Task[None] | None = None

    @property
    def offered(self) -> int:
        """Pairs handed to the publisher."""
        return self.calls.offered

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
                await self.calls.run(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in pair building must stay here
                log.exception("shadow job failed")
                self.calls.error(job.plan.route, "shadow", "bug")
            finally:
                self.in_flight -= 1
                if not self._queue and not self.in_flight:
                    self._idle.set()

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
