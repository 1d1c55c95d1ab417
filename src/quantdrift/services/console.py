"""The one-click console: read a route's breaker, or steer it by hand.

A manual rollback or restore is signed like the breaker's commands, bumps the
route's epoch in the same atomic Redis step, and locks the route so the breaker
does not undo it; ``release`` hands the route back to the breaker. The outbox is
then sent at once through the worker's relay. ``quantdrift route`` and preflight's
switch drill both call this, so the drill times exactly what on-call runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from quantdrift import otel
from quantdrift.breaker.evidence import live_evidence
from quantdrift.breaker.outbox import OutboxItem
from quantdrift.breaker.policy import load_policy
from quantdrift.breaker.readiness import readiness, rule_names
from quantdrift.breaker.relay import OutboxRelay
from quantdrift.breaker.slice_scope import report as slice_report
from quantdrift.breaker.state import RouteState
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import Settings, configured_redis_url
from quantdrift.detectors.tolerance import DIVERGENCES
from quantdrift.errors import BreakerStoreError, InputError
from quantdrift.integrations.verdict import route_verdict
from quantdrift.kafka_clients import producer_kwargs
from quantdrift.schemas.signing import signer_from_settings


@dataclass(frozen=True, slots=True)
class ManualStep:
    """What a manual step did: the route's state after it, and a publish warning if any."""

    route: str
    action: str
    state: RouteState
    warning: str | None = None

    def summary(self) -> str:
        """The console's one line, e.g. ``r: rollback -> open target=reference epoch=7``."""
        s = self.state
        lock = " (locked)" if s.locked else ""
        return f"{self.route}: {self.action} -> {s.state} target={s.target} epoch={s.epoch}{lock}"


@contextlib.asynccontextmanager
async def open_store(settings: Settings) -> AsyncIterator[RedisBreakerStore]:
    """The route store under the settings' Redis, prefix and active signing key."""
    client = aioredis.Redis.from_url(configured_redis_url(settings), socket_timeout=3)
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)
    try:
        yield RedisBreakerStore(client, signer, key_prefix=settings.redis.key_prefix)
    finally:
        await client.aclose()


async def route_status(settings: Settings, route: str | None = None) -> list[dict[str, Any]]:
    """One row per route (``route`` alone, else every route the store knows).

    A named route the store has never seen is an InputError: Redis answers a default
    "closed" for any name, and a typo must not read as healthy. ``armed`` is the decision
    core's readiness (``breaker/readiness.py``): closed, and every test the route's policy
    relies on can fire; ``readiness`` says ``armed``, ``warming`` or ``partly armed``,
    ``missing`` names what a relied-on test lacks, ``rules`` has each test's readiness,
    ``slices`` each slice the route has seen (``breaker/slice_scope.report``: its pairs,
    ``testing`` or ``insufficient_data``, or ``rolled_back`` / ``half_open`` when a
    slice-scoped rollback holds it apart, and its own ``breaker``), and ``reason`` is in
    the words the verdict API gives rollout controllers. ``window``, ``calibration``
    and ``worst_pairs`` are the evidence a certificate binds (``breaker/evidence.py``).
    """
    policies = load_policy(settings.policy_file)
    async with open_store(settings) as store:
        known = await store.routes()
        if route and route not in known:
            raise InputError(
                f"unknown route {route!r}; known routes: {', '.join(known) or 'none yet'}"
            )
        routes = [route] if route else known
        rows = []
        for name in routes:
            state, version = await store.read(name)
            floors = await store.read_floors(name)
            policy = policies.for_route(name)
            verdict = route_verdict(name, state, version, policy, None, floors)
            ready = verdict.readiness.as_json()
            rows.append(
                {
                    "route": name,
                    "state": state.state,
                    "target": state.target,
                    "epoch": state.epoch,
                    "locked": state.locked,
                    "pairs_seen": state.pairs_seen,
                    "last_decision": state.last_decision,
                    "last_similarity": state.last_similarity,
                    "min_pairs": verdict.min_pairs,
                    "armed": verdict.armed,
                    "verdict": verdict.verdict,
                    "readiness": ready["readiness"],
                    "missing": ready["missing"],
                    "rules": ready["rules"],
                    "slices": slice_report(policy, state),
                    "reason": verdict.reason,
                    **live_evidence(state, floors),
                }
            )
        return rows


async def launch_readiness(
    settings: Settings, route: str, expected: tuple[str, ...]
) -> dict[str, Any]:
    """Whether the route's divergence tests can fire once it has ``min_pairs``: preflight's
    "the route is armed" (the shadow link's item).

    Before launch a route may have no shadow pairs, so nothing says yet which evidence
    they will carry: ``expected`` names the divergence tests the gateway's config and the
    worker's scorer will feed (``lexical`` always, ``dissimilarity`` with an embedder,
    ``tf_kl`` with teacher forcing, ``entropy`` with logprobs), and they are relied on
    until the route's own pairs say otherwise (``breaker/readiness.py``). ``min_pairs``
    is not asked for: traffic brings it, a floor does not come by itself.
    """
    policy = load_policy(settings.policy_file).for_route(route)
    async with open_store(settings) as store:
        state, _ = await store.read(route)
        floors = await store.read_floors(route)
    if policy.relies_on is None and not state.readiness.carried:
        names = [name.removeprefix("tolerance:") for name in rule_names(policy)]
        relied = [n for n in names if n not in DIVERGENCES or n in expected]
        policy = policy.model_copy(update={"relies_on": tuple(relied)})
    ready = readiness(policy, state, floors)
    return {
        "armed": not ready.missing,
        "missing": list(ready.missing),
        "pairs_seen": state.pairs_seen,
        "rules": ready.as_json()["rules"],
    }


async def manual_step(settings: Settings, route: str, action: str, who: str) -> ManualStep:
    """Rollback, restore or release ``route`` by hand, then publish its outbox."""
    policy = load_policy(settings.policy_file).for_route(route)
    async with open_store(settings) as store:
        result = await store.manual(route, action, policy, time.time(), who=who)
        otel.transitioned(result.outbox)
        warning = await publish_outbox(settings, store, route)
    if result.state is None:  # only a duplicate fold has no state; manual steps never are
        raise BreakerStoreError(f"{route}: no state after {action}")
    return ManualStep(route, action, result.state, warning)


async def publish_outbox(settings: Settings, store: RedisBreakerStore, route: str) -> str | None:
    """Send the route's outbox now, through the same relay as the worker.

    Returns a warning when Kafka could not take it: the Redis route key still
    steers gateways, and the worker's clock sends the queued command once the
    broker is back.
    """
    producer = AIOKafkaProducer(**producer_kwargs(settings.kafka))
    topics = settings.kafka.topics

    async def send(item: OutboxItem) -> None:
        topic = topics.control if item.topic == "control" else topics.alerts
        await producer.send_and_wait(topic, key=route.encode(), value=item.value)

    relay = OutboxRelay(store, send, owner=f"cli:{os.getpid()}")
    try:
        await asyncio.wait_for(producer.start(), timeout=10)
    except (TimeoutError, OSError, KafkaError) as exc:
        with contextlib.suppress(Exception):
            await producer.stop()
        return f"could not publish to Kafka ({type(exc).__name__}); the Redis route key is set"
    try:
        if await relay.flush(route) == 0 and relay.stats.send_failures:
            return "could not publish to Kafka; the Redis route key is set"
        return None
    finally:
        await producer.stop()
