"""The gateway as a service: its parts composed once, started and stopped in order.

``Gateway`` holds what every request shares (config, pools, controller,
publishers, shadow runner, preflight gate, retry budget, loop-lag monitor, metrics)
and owns their
lifecycle: one supervisor for every long-lived task, start in dependency order,
stop with bounded drains so a shutdown stays inside a container's grace period.
It serves nothing itself: the routes are ``app.py`` over ``endpoints.py`` (or, for the
collector role behind a gateway quantdrift does not own, ``collector.py``), and
health and live metrics are ``observability.py``. The composition root that
builds one from a config file and settings is ``services/gateway.build_gateway``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping

from quantdrift.gateway.chain.attempts import Degradations
from quantdrift.gateway.chain.executor import FallbackExecutor
from quantdrift.gateway.chain.routing import RouteDirective, SliceDirective
from quantdrift.gateway.chain.slices import TaskVocabulary
from quantdrift.gateway.control.controller import RouteController
from quantdrift.gateway.control.evidence import EvidenceWatch, ShareGovernor
from quantdrift.gateway.control.floors import FloorWatch
from quantdrift.gateway.control.preflight_gate import PreflightGate
from quantdrift.gateway.control.share import Evidence
from quantdrift.gateway.control.spend_report import SpendReport
from quantdrift.gateway.gateway_config import GatewayConfig, candidate_route
from quantdrift.gateway.guards.auth import Authenticator
from quantdrift.gateway.guards.capacity import RetryBudget
from quantdrift.gateway.guards.overload import LoopLag
from quantdrift.gateway.http.observability import live_metrics
from quantdrift.gateway.shadow.publisher import DegradationPublisher, ShadowPublisher
from quantdrift.gateway.shadow.runner import ShadowRunner
from quantdrift.gateway.telemetry import Telemetry
from quantdrift.gateway.upstream.pools import Upstreams
from quantdrift.gateway.upstream.transport import Transport
from quantdrift.schemas.ed25519 import TrustedKey
from quantdrift.schemas.privacy import salt_problem
from quantdrift.supervision import Supervisor, cancelled

log = logging.getLogger(__name__)

# On shutdown, after the shadow drain: what Kafka gets to take the queued pairs.
# With uvicorn's 2 s and the default 4 s drain, a stop stays under Docker's 10 s.
PUBLISH_DRAIN_S = 2.0


class Gateway:
    """The gateway's parts, composed once, started and stopped together.

    Pools, controller, publishers, shadow runner, preflight gate, retry budget and
    metrics, all under one supervisor; ``app.create_app`` serves requests over them
    (``endpoints.py``) and ``observability.py`` reports on them.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        publisher: ShadowPublisher | None = None,
        degradations: DegradationPublisher | None = None,
        controller: RouteController | None = None,
        upstreams: Upstreams | None = None,
        shadow_upstreams: Upstreams | None = None,
        preflight_keys: Mapping[str, TrustedKey] | None = None,
        floors: FloorWatch | None = None,
        evidence: EvidenceWatch | None = None,
        spend_report: SpendReport | None = None,
        mirrored_share: float = 1.0,
        transport: Transport | None = None,
    ) -> None:
        self.config = config
        self.floors = floors
        self.evidence = evidence
        self.spend_report = spend_report
        self.publisher = publisher
        self.degradations = degradations
        self.controller = controller
        # ``transport``: the model servers' (both sides) when not the network's, e.g. an
        # in-memory upstream (``upstream/transport.py``).
        self.upstreams = upstreams or Upstreams(config, transport=transport)
        self.auth = Authenticator(config.auth)
        self.metrics = Telemetry()
        # The gateway's own overload: sheds new requests, and keeps a timeout its own lag
        # caused from being blamed on an upstream (``overload.py``).
        o = config.overload
        self.loop_lag = LoopLag(max_lag_s=o.max_loop_lag_s, tick_s=o.tick_s)
        self.upstreams.attribute_lag(self.loop_lag)
        # A secret salt: a caller cannot compute which of its requests get mirrored.
        self.sample_salt = config.sample_salt or secrets.token_hex(16)
        prompt_salt = config.prompt_salt or self.sample_salt
        if isinstance(publisher, ShadowPublisher) and not publisher.prompt_salt:
            publisher.prompt_salt = prompt_salt  # one salt for every prompt hash
        self.prompt_salt_problem = salt_problem(prompt_salt)
        # The callers' task tags, bounded (``slices.py``): one vocabulary per gateway.
        self.tasks = TaskVocabulary(config.slices.tasks, config.slices.max_tasks)
        self.budget = RetryBudget(
            config.retry_budget.ratio,
            config.retry_budget.min_per_window,
            config.retry_budget.window_s,
        )
        self.executor = FallbackExecutor(
            config,
            self.upstreams,
            self.metrics,
            Degradations(degradations.offer if degradations is not None else None),
            self.budget,
        )
        self.shadow = ShadowRunner(
            config,
            shadow_upstreams or Upstreams(config, shadow=True, transport=transport),
            publisher.offer if publisher is not None else None,
            self.directive,
            prompt_salt=prompt_salt,
            mirrored_share=mirrored_share,
            # The same cap a request gets: a job's candidate is re-checked against it.
            cap_of=lambda route: self.preflight.cap(route),
        )
        self.shadow.upstreams.attribute_lag(self.loop_lag)
        # Adaptive shadow shares (control/share.py): the breaker's evidence, read by
        # ``evidence``, and the reference tokens shadowing spent, the route's and its
        # extra candidates' (their teacher-forced passes are the same reference's).
        self.shares = ShareGovernor(
            config,
            evidence.of if evidence is not None else (lambda _route: Evidence()),
            lambda route: self.shadow.spend.reference(
                (route, *(candidate_route(route, p) for p in config.routes[route].extra_candidates))
            ),
        )
        # Routes with a ``preflight:`` gate verify their report with the signing key ring.
        self.preflight = PreflightGate(config, dict(preflight_keys or {}))
        # One supervisor for every long-lived task: crashes counted in /metrics, and a
        # task given up on makes /health answer 503.
        self.supervisor = Supervisor()
        if spend_report is not None:  # for the worker's status page (``spend_report.py``)
            spend_report.bind(self.spend_figures)
        parts = (self.shadow, self.preflight, publisher, degradations, controller, floors,
                 evidence, spend_report)  # fmt: skip
        for part in parts:
            if part is not None:
                part.supervisor = self.supervisor
        self.metrics.live(lambda: live_metrics(self))
        self.started_at = time.time()
        self._lag_task: asyncio.Task[None] | None = None
        # Names an error message must never show a client (``openai_errors.client_error``).
        self.hosts = self.upstreams.hosts

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if not self.auth.enabled:
            log.warning(
                "gateway: no auth keys configured, every caller may use every route and "
                "high_precision (add an auth: section to the config)"
            )
        if not self.config.sample_salt:
            log.warning(
                "gateway: no sample_salt, a random one per process (sampling differs "
                "across replicas)"
            )
        if self.prompt_salt_problem is not None:
            log.error(
                "gateway: the prompt salt %s: prompt hashes in pairs can be reversed by "
                "anyone who guesses prompts. Set prompt_salt (or sample_salt) to a secret.",
                self.prompt_salt_problem,
            )
        self._lag_task = self.supervisor.spawn("loop-lag", self.loop_lag.run)
        await self.preflight.start()
        await self.shadow.start()
        if self.publisher is not None:
            await self.publisher.start()
        if self.degradations is not None:
            await self.degradations.start()
        if self.controller is not None:
            for route in self.config.routes:
                self.controller.watch(route)
            await self.controller.start()
        if self.floors is not None:
            await self.floors.start()
        if self.evidence is not None:
            await self.evidence.start()
        if self.spend_report is not None:
            await self.spend_report.start()

    async def stop(self, timeout: float | None = None) -> None:
        """Stop everything; shadow jobs get ``shadow_drain_s`` (or ``timeout``) to finish."""
        timeout = self.config.shadow_drain_s if timeout is None else timeout
        await self.preflight.stop()
        if self.floors is not None:
            await self.floors.stop()
        if self.evidence is not None:
            await self.evidence.stop()
        await self.shadow.stop(timeout)
        if self.spend_report is not None:  # after the drain: its jobs' spend is in
            await self.spend_report.stop()
        if self.controller is not None:
            await self.controller.stop()
        if self.publisher is not None:
            await self.publisher.stop(PUBLISH_DRAIN_S)
        if self.degradations is not None:
            await self.degradations.stop(PUBLISH_DRAIN_S)
        await self.upstreams.aclose()
        await cancelled(self._lag_task)

    def on_linger(self, end: str, discarded: int) -> None:
        """Count a lingering close (``lingering.py``): how it ended, what it discarded."""
        self.metrics.lingering_closes.labels(end).inc()
        self.metrics.lingered_bytes.inc(discarded)

    async def wait_shadows(self, timeout: float) -> None:
        """Wait until the shadow queue is empty and idle (tests, benchmarks)."""
        await self.shadow.wait_idle(timeout)

    @property
    def ready(self) -> bool:
        """False when a background task was given up on (see ``supervision.py``)."""
        return self.supervisor.ready

    def control_stale(self) -> bool:
        """Whether neither control source has answered for ``control_stale_s``."""
        if self.controller is None:
            return False
        age = self.controller.verified_age()
        return age is not None and age > self.config.control_stale_s

    def filling(self, route: str) -> bool:
        """Whether the route's sampled noise floor is still filling (``noise_fill``); not
        while its adaptive share's bucket is empty (the noise runs are reference spend too)."""
        last = self.shares.last.get(route)
        if last is not None and last.reason == "floor":
            return False
        return self.floors is not None and self.floors.filling(route)

    def spend_figures(self) -> dict[str, dict[str, object]]:
        """Per route id (extra candidates' included), what shadowing spent since start and
        the share of the route's traffic shadowed now: this gateway's spend report.

        The share is the adaptive share's last decision (or, before the route's first
        request, the one it would make), else the route's flat ``shadow_sample_rate``;
        either times ``mirrored_share`` (a collector sees only what is mirrored to it).
        An extra candidate is judged on its route's sampled requests: the same share.
        """
        out: dict[str, dict[str, object]] = {}
        for route, rc in self.config.routes.items():
            last = self.shares.last.get(route)
            if last is None and self.shares.share(route, requests=0) is not None:
                last = self.shares.last[route]
            share = last.share if last is not None else self.config.shadow_rate(route)
            head = {
                "share": round(share * self.shadow.mirrored_share, 6),
                "share_reason": last.reason if last is not None else "flat",
            }
            for sub in (route, *(candidate_route(route, p) for p in rc.extra_candidates)):
                out[sub] = {**head, **self.shadow.spend.totals(sub)}
        return out

    def share(self, route: str) -> float | None:
        """The route's adaptive shadow share for one request, None for a flat route."""
        return self.shares.share(route)

    def directive(self, route: str) -> RouteDirective | None:
        """The route's directive (``routing.RouteDirective``) as the controller knows it.

        Fail closed: until the controller has read the route keys or replayed the
        control topic once (``backstop_known``), and again once neither control source
        has answered for ``control_stale_s`` (a partition), a route may be locked in
        rollback without this process knowing, so every route serves its reference (no
        candidate call, not even in shadow) -- rather than report not-ready, since the
        reference can still answer users. The last verified state holds until then.
        """
        if self.controller is None:
            return None
        if not self.controller.backstop_known or self.control_stale():
            return RouteDirective("rollback", self.config.routes[route].reference)
        applied = self.controller.state(route)
        if applied is None:
            return None
        slices = tuple(
            SliceDirective(h.dimension, h.value, h.action, h.target_precision, h.percent)
            for h in applied.slices
        )
        return RouteDirective(applied.action, applied.target_precision, applied.percent, slices)
