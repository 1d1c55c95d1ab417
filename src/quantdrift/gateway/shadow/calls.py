"""One shadow job's upstream calls: the other side, the noise run, teacher forcing, and
the route's extra candidates, each metered; what the pairs say is ``pairs.py``'s.

A job runs under one deadline (``timeouts.shadow_total_s``). Its answers are cached
by pool for the job's life, so the reference answers **once per sampled request**:
the shadow pair's reference run is the noise pair's first, and the one every extra
candidate of the route (``routes.R.extra_candidates``) is judged against. Each extra
candidate publishes its own pair under its own route id
(``gateway_config.candidate_route``: ``R@pool``), with its own teacher-forced pass
when the route is teacher-forced, and a copy of each noise pair (the same two
reference runs: its divergence tests get the route's floor). Its spend is metered
under that id, so the side-by-side report can set each candidate's evidence beside
its cost. Extra
candidates run only on requests that are shadow-sampled while the route pairs a
candidate at all (not while it is rolled back).

Every failure stays here: counted by route, kind and reason (``errors``), never
raised to the runner's workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quantdrift.errors import GatewayOverloaded, UpstreamError
from quantdrift.gateway.chain.planning import Plan
from quantdrift.gateway.chain.routing import RouteDirective
from quantdrift.gateway.gateway_config import GatewayConfig, candidate_route
from quantdrift.gateway.openai_wire import Accumulator, Completion
from quantdrift.gateway.shadow.pairs import (
    build_pair,
    candidate_suspended,
    pair_rate,
    shadow_body,
    side_of,
)
from quantdrift.gateway.shadow.probes import PoolProbe
from quantdrift.gateway.shadow.spend import SpendMeter
from quantdrift.gateway.upstream.pools import UpstreamClientError, Upstreams, error_reason
from quantdrift.gateway.upstream.teacher_forcing import Failed, Scored
from quantdrift.schemas.pair import PairEvent

log = logging.getLogger("quantdrift.gateway.shadow.runner")

# Drop reasons of a running job (quantdrift_gateway_shadow_dropped_total).
ROLLED_BACK = "route_rolled_back"
DEADLINE = "deadline"


@dataclass(frozen=True, slots=True)
class ShadowJob:
    plan: Plan
    user: Completion | None  # stripped: only what the pair needs; None: ask both sides
    queued_at: float


@dataclass(slots=True)
class Wiring:
    """What the calls need from the gateway: where pairs go, the route's state now, the
    prompt salt, the share mirrored to this runner, the clock that times calls."""

    offer: Callable[[PairEvent], Any] | None
    directive_of: Callable[[str], RouteDirective | None]
    cap_of: Callable[[str], float | None]
    salt: str
    mirrored_share: float
    clock: Callable[[], float]


class ShadowCalls:
    """A job's calls (module docstring); the counters are the runner's, shared."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Upstreams,
        wiring: Wiring,
        probe: PoolProbe,
        spend: SpendMeter,
        dropped: dict[str, int],
        errors: dict[tuple[str, str, str], int],
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.wiring = wiring
        self.probe = probe
        self.spend = spend
        self.dropped = dropped
        self.errors = errors
        self.offered = 0
        self._tf_logged: set[tuple[str, str]] = set()

    def error(self, route: str, kind: str, reason: str) -> None:
        key = (route, kind, reason)
        self.errors[key] = self.errors.get(key, 0) + 1

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    async def run(self, job: ShadowJob) -> None:
        plan = job.plan
        cache: dict[str, Completion] = {} if job.user is None else {job.user.precision: job.user}
        try:
            async with asyncio.timeout(self.config.timeouts.shadow_total_s):
                for kind, wanted in (("shadow", plan.shadow), ("noise", plan.noise)):
                    if wanted:
                        await self._pair(kind, plan, cache)
                if plan.shadow and plan.decision.pair_candidate is not None:
                    for pool in self.config.routes[plan.route].extra_candidates:
                        await self._pair("shadow", plan, cache, pool)
        except TimeoutError:
            self._drop(DEADLINE)
            self.error(plan.route, "shadow", "deadline")

    async def _pair(
        self, kind: str, plan: Plan, cache: dict[str, Completion], extra: str | None = None
    ) -> None:
        route = plan.route if extra is None else candidate_route(plan.route, extra)
        try:
            if extra is not None:
                pairs = [await self._extra_pair(plan, cache, extra)]
            elif kind == "shadow":
                pairs = [await self._shadow_pair(plan, cache)]
            else:
                pairs = await self._noise_pairs(plan, cache)
        except UpstreamError as exc:
            self.error(route, kind, f"upstream_{error_reason(exc)}")
            return
        except GatewayOverloaded:
            self.error(route, kind, "overloaded")
            return
        except UpstreamClientError:
            self.error(route, kind, "upstream_rejected")
            return
        for pair in pairs:
            if pair is None:
                continue
            if self.wiring.offer is None:
                self.error(pair.route, kind, "no_publisher")
                continue
            self.offered += 1
            self.wiring.offer(pair)

    async def _collect(
        self, plan: Plan, purpose: str, precision: str, meter_as: str | None = None
    ) -> Completion:
        """One shadow call, metered (``spend.py``) under ``meter_as`` (default the
        plan's route) whatever its end."""
        acc = Accumulator(precision, keep_logprobs=self.config.limits.max_logprob_tokens)
        body = shadow_body(self.config, plan)
        stream = self.upstreams[precision].stream(body, total_s=self.config.timeouts.shadow_total_s)
        started, done = self.wiring.clock(), None
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    acc.add(chunk)
            done = acc.finish().stripped(self.config.top_logprobs)
            return done
        finally:
            side = side_of(self.config, plan.route, precision)
            seconds = self.wiring.clock() - started
            self.spend.answer(meter_as or plan.route, side, purpose, seconds, done)

    async def _shadow_pair(self, plan: Plan, cache: dict[str, Completion]) -> PairEvent | None:
        d = plan.decision
        if d.pair_candidate is None:
            return None
        for precision in (d.pair_candidate, d.pair_reference):
            if precision in cache:
                continue
            if precision == d.pair_candidate and candidate_suspended(
                self.config, plan, self.wiring.directive_of, self.wiring.cap_of
            ):
                self._drop(ROLLED_BACK)
                return None
            cache[precision] = await self._collect(plan, "shadow", precision)
        cand, ref = cache[d.pair_candidate], cache[d.pair_reference]
        tf = None
        if self.config.routes[plan.route].teacher_forced and cand.text:
            tf = await self._teacher_forced(plan, d.pair_reference, cand)
        return self._build(plan, "shadow", (cand, ref), tf)

    async def _extra_pair(
        self, plan: Plan, cache: dict[str, Completion], pool: str
    ) -> PairEvent | None:
        """An extra candidate against the job's one reference answer (asked now only if
        the route's own pair did not get it)."""
        route = candidate_route(plan.route, pool)
        ref = plan.decision.pair_reference
        if ref not in cache:
            cache[ref] = await self._collect(plan, "shadow", ref)
        cand = await self._collect(plan, "shadow", pool, meter_as=route)
        tf = None
        if self.config.routes[plan.route].teacher_forced and cand.text:
            tf = await self._teacher_forced(plan, ref, cand, meter_as=route)
        return self._build(plan, "shadow", (cand, cache[ref]), tf, extra=pool)

    async def _teacher_forced(
        self, plan: Plan, reference: str, cand: Completion, meter_as: str | None = None
    ) -> Scored | None:
        """The reference's log-probs of the candidate's tokens (with its top-k and the
        candidate's ranks where the server reports them), or None: every None is
        counted (``shadow_errors{reason="tf_..."}``), and logged once per pool and reason.
        The pass is metered as ``teacher_forcing`` spend, failed or not."""
        route = meter_as or plan.route
        started, outcome = self.wiring.clock(), None
        try:
            outcome = await self.upstreams[reference].score(
                plan.body.get("messages"),
                cand,
                timeout_s=self.config.timeouts.shadow_total_s,
                top_k=self.config.top_logprobs,
            )
        finally:
            side = side_of(self.config, plan.route, reference)
            self.spend.forced(route, side, self.wiring.clock() - started, outcome)
        if outcome is None:
            return None
        if isinstance(outcome, Scored):
            return outcome
        self.error(route, "shadow", f"tf_{outcome.reason}")
        if (reference, outcome.reason) not in self._tf_logged:
            self._tf_logged.add((reference, outcome.reason))
            _log_tf_failure(self.config.pool(reference).teacher_forcing, reference, outcome)
        return None

    async def _noise_pairs(
        self, plan: Plan, cache: dict[str, Completion]
    ) -> list[PairEvent | None]:
        """The route's noise pair, and the same two reference runs under each extra
        candidate's route id: every candidate's divergence tests get the route's floor,
        for no more reference calls."""
        ref = plan.decision.pair_reference
        if ref not in cache:
            cache[ref] = await self._collect(plan, "noise", ref)
        # The second run uses the same decoding as the first: a greedy request's noise
        # pair must measure greedy-vs-greedy disagreement (batching nondeterminism on
        # GPU servers), never a sampled run labelled greedy. Where two greedy runs are
        # identical the floor drops the pair and the blessed baseline stands in.
        second = await self._collect(plan, "noise", ref)
        extras = self.config.routes[plan.route].extra_candidates
        return [
            self._build(plan, "noise", (cache[ref], second), None, extra)
            for extra in (None, *extras)
        ]

    def _build(
        self,
        plan: Plan,
        kind: str,
        sides: tuple[Completion, Completion],
        tf: Scored | None,
        extra: str | None = None,
    ) -> PairEvent:
        return build_pair(
            self.config,
            plan,
            kind,
            sides,
            tf,
            rate=pair_rate(
                self.config, plan.route, kind, self.wiring.mirrored_share, plan.shadow_rate
            ),
            salt=self.wiring.salt,
            identities=self.probe.identities,
            ts=time.time(),
            extra=extra,
        )


def _log_tf_failure(mode: str, reference: str, outcome: Failed) -> None:
    """Once per pool and reason (the caller keeps which): pairs go without tf_kl."""
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
