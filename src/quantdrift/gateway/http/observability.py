"""What the gateway says about itself: ``/health``, live metrics, per-answer timings.

* ``health``: each route's serving precision and mode (the same ``route_decision`` a
  request gets), control and Kafka state, queue depths; 503 once a supervised
  task was given up on.
* ``live_metrics``: numbers other parts keep (publisher and controller counters,
  crashes, ejections), read at scrape time rather than copied on every change.
* ``served``: one answer's outcome, latency, TTFT, TPOT and tokens.

Read-only over the ``Gateway``'s parts: nothing here changes what is served.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from quantdrift import otel
from quantdrift.gateway.chain.attempts import Trace
from quantdrift.gateway.chain.planning import Incoming, Plan, route_decision
from quantdrift.gateway.gateway_config import candidate_route
from quantdrift.gateway.guards.auth import OPEN
from quantdrift.gateway.openai_wire import Completion
from quantdrift.gateway.telemetry import Telemetry, counter, gauge

if TYPE_CHECKING:  # the Gateway registers live_metrics: a runtime import would be a cycle
    from quantdrift.gateway.http.service import Gateway


def health(gateway: Gateway, private: bool = True) -> dict[str, Any]:
    """The gateway's view; ``private`` (an authenticated admin) adds who signed what."""
    cfg = gateway.config
    routes = {}
    gates = gateway.preflight.health(private)
    # What a request would get now: the same decision planning makes, cap included.
    incoming = Incoming(
        headers={},
        principal=OPEN,
        request_id="health",
        directive_of=gateway.directive,
        cap_of=gateway.preflight.cap,
    )
    for route, rc in cfg.routes.items():
        directive = gateway.directive(route)
        d = route_decision(cfg, route, "cost_optimized", incoming)
        routes[route] = {
            "serving": d.serve,
            "mode": d.mode,
            "epoch": gateway.controller.epoch(route) if gateway.controller else 0,
            # Slices held apart by a slice-scoped rollback: where their requests go.
            "slices": {
                f"{h.dimension}={h.value}": {
                    "serving": (
                        sd := route_decision(
                            cfg, route, "cost_optimized", incoming, {h.dimension: h.value}
                        )
                    ).serve,
                    "mode": sd.mode,
                }
                for h in (directive.slices if directive else ())
            },
        }
        # Shadowing's own calls, apart from what users were served (shadow/spend.py).
        routes[route]["shadow_spend"] = gateway.shadow.spend.view(route)
        if rc.extra_candidates:  # judged side by side, each under its own route id
            routes[route]["extra_candidates"] = {
                pool: {"route": sub, "shadow_spend": gateway.shadow.spend.view(sub)}
                for pool in rc.extra_candidates
                for sub in (candidate_route(route, pool),)
            }
        share = gateway.shares.view(route)
        if share is not None:  # adaptive: the share now, why, the cap and the evidence
            routes[route]["shadow_share"] = share
        gate = gates.get(route)
        if gate is not None:
            routes[route]["preflight"] = gate
        if gateway.floors is not None:
            # Whether the route's divergence tests have their floor is the worker's to
            # say (route status, the verdict API); this is how fast this gateway fills it.
            routes[route]["noise_floor"] = gateway.floors.view(route)
    return {
        "status": "ok" if gateway.ready else "not_ready",
        "failed_tasks": sorted(gateway.supervisor.failed),
        "routes": routes,
        "precisions": {p: len(u) for p, u in cfg.precisions.items()},
        "kafka_connected": bool(gateway.publisher and gateway.publisher.connected),
        "control_ready": bool(gateway.controller and gateway.controller.kafka_ready),
        # False: the routes' latest commands are unknown yet; every route on its reference.
        "control_known": gateway.controller is None or gateway.controller.backstop_known,
        # True: neither control source answered for control_stale_s; routes on the reference.
        "control_stale": gateway.control_stale(),
        # This gateway's reports to the worker's status page (``spend_report.py``).
        "spend_report": None
        if gateway.spend_report is None
        else {"gateway": gateway.spend_report.name, "errors": gateway.spend_report.read_errors},
        "shadow_queue": gateway.shadow.depth,
        "shadow_in_flight": gateway.shadow.in_flight,
        "auth": gateway.auth.enabled,
    }


def live_metrics(gateway: Gateway) -> Iterator[Any]:
    """Numbers other components keep, read at scrape time."""
    yield from gateway.shadow.collect()
    yield counter(
        "task_crashes",
        "background task crashes (each logged with its traceback, then restarted)",
        ["task"],
        {(k,): float(v) for k, v in gateway.supervisor.crashes.items()},
    )
    yield gauge("ready", "0 once a task was given up on", [], {(): float(gateway.ready)})
    yield gauge(
        "loop_lag_seconds",
        "how late the event loop runs (smoothed); at overload.max_loop_lag_s requests are shed",
        [],
        {(): gateway.loop_lag.current(time.monotonic())},
    )
    yield gauge(
        "shadow_share",
        "each route's shadow share now (adaptive_share: follows the evidence, under a cap)",
        ["route", "reason"],
        {(r, s.reason): s.share for r, s in gateway.shares.last.items()},
    )
    dropped = {("queue", r): float(n) for r, n in gateway.shadow.dropped.items()}
    if gateway.publisher is not None:
        s = gateway.publisher.stats
        yield counter("pairs_offered", "pairs offered to the publisher", [], {(): s.offered})
        yield counter("pairs_sent", "pairs acknowledged by Kafka", [], {(): s.sent})
        yield gauge(
            "pairs_queue_depth", "pairs waiting for Kafka", [], {(): gateway.publisher.queue_depth}
        )
        dropped.update({("publish", r): float(n) for r, n in s.dropped.items()})
    yield counter(
        "shadow_dropped",
        "shadow work dropped, by stage and reason",
        ["stage", "reason"],
        dropped,
    )
    if gateway.degradations is not None:
        d = gateway.degradations.stats
        yield counter(
            "degradation_events",
            "degradation events, by outcome",
            ["outcome"],
            {("sent",): d.sent, ("dropped",): d.dropped_total},
        )
    if gateway.preflight.status:
        yield gauge(
            "preflight_verified",
            "1 when the route's preflight report verifies (else its candidate is capped)",
            ["route"],
            {(r,): float(st.verified) for r, st in gateway.preflight.status.items()},
        )
    ejected = {
        (p,): float(pool.outliers.ejected_total) for p, pool in gateway.upstreams.pools.items()
    }
    yield counter(
        "upstream_ejections", "servers ejected by outlier detection", ["precision"], ejected
    )
    if gateway.controller is not None:
        # 0 while commands reach this gateway only through the Redis backstop:
        # the alert rules page on it (deploy/prometheus/alerts.yml).
        yield gauge(
            "control_ready",
            "1 while the control topic is followed",
            [],
            {(): float(gateway.controller.kafka_ready)},
        )
        yield gauge(
            "route_epoch",
            "epoch of the route's applied command",
            ["route"],
            {(r,): gateway.controller.epoch(r) for r in gateway.config.routes},
        )
        yield counter(
            "commands_refused",
            "control commands refused, by reason",
            ["reason"],
            {(k,): v for k, v in gateway.controller.verifier.refused.items()},
        )


def served(
    metrics: Telemetry, plan: Plan, trace: Trace, completion: Completion, *, streamed: bool
) -> None:
    """Count one answer served: outcome, latency, TTFT, TPOT, tokens, shadow sampling.

    TTFT is to the first token the user got: on a stream, when it left the gateway
    (``trace.first_token_at``); buffered, when the serving attempt produced it.
    TPOT spreads the rest of the answer over its remaining tokens.
    """
    m = metrics
    precision = completion.precision
    now = time.monotonic()
    m.requests.labels(plan.route, precision, "ok").inc()
    otel.served(plan, trace, completion)
    m.latency.labels(plan.route, precision, "true" if plan.stream else "false").observe(
        now - trace.t0
    )
    if streamed:
        first = trace.first_token_at
    elif completion.first_token_s is not None:
        first = trace.attempt_t0 + completion.first_token_s
    else:
        first = None
    tokens = completion.completion_tokens
    if first is not None:
        m.ttft.labels(plan.route, precision).observe(max(0.0, first - trace.t0))
        if tokens > 1:
            end = now if streamed else trace.attempt_t0 + completion.latency_ms / 1000
            m.tpot.labels(plan.route, precision).observe(max(0.0, end - first) / (tokens - 1))
    if tokens:
        m.tokens.labels(plan.route, precision).inc(tokens)
    for kind, wanted in (("shadow", plan.shadow), ("noise", plan.noise)):
        if wanted:
            m.shadow_sampled.labels(plan.route, kind).inc()
