"""``quantdrift route status|rollback|restore|release --route R``: the one-click console.

A manual rollback or restore is signed like the breaker's commands, bumps the
route's epoch in the same atomic Redis step, and locks the route so the breaker
does not undo it; ``release`` hands the route back to the breaker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import os
import sys
import time
from typing import TYPE_CHECKING

from quantdrift.cli.common import load_settings, redis_url, signing_settings, with_stack
from quantdrift.errors import BreakerStoreError, InputError
from quantdrift.integrations import otel

if TYPE_CHECKING:
    from quantdrift.breaker.store import RedisBreakerStore
    from quantdrift.config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("route", help="show or steer a route's breaker")
    p.add_argument("action", choices=["status", "rollback", "restore", "release"])
    p.add_argument("--route", required=False, help="route name, e.g. cs-agent/int4 (status: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action != "status" and not args.route:
        raise InputError(f"route {args.action} needs --route")
    settings = signing_settings(with_stack(load_settings()))
    return asyncio.run(_run(settings, args))


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    # Deferred: the breaker store pulls in the detectors (numpy, scoring), too slow for --help.
    import redis.asyncio as aioredis

    from quantdrift.breaker.policy import load_policy
    from quantdrift.breaker.store import RedisBreakerStore
    from quantdrift.schemas.signing import signer_from_settings

    client = aioredis.Redis.from_url(redis_url(settings), socket_timeout=3)
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)
    store = RedisBreakerStore(client, signer, key_prefix=settings.redis.key_prefix)
    try:
        if args.action == "status":
            known = await store.routes()
            if args.route and args.route not in known:
                # Redis answers a default "closed" for any name; a typo must not read as healthy.
                raise InputError(
                    f"unknown route {args.route!r}; known routes: {', '.join(known) or 'none yet'}"
                )
            routes = [args.route] if args.route else known
            rows = []
            for route in routes:
                state, _ = await store.read(route)
                rows.append(
                    {
                        "route": route,
                        "state": state.state,
                        "target": state.target,
                        "epoch": state.epoch,
                        "locked": state.locked,
                        "pairs_seen": state.pairs_seen,
                        "last_decision": state.last_decision,
                        "last_similarity": state.last_similarity,
                    }
                )
            if args.json:
                print(json.dumps(rows))
            else:
                for r in rows:
                    lock = " LOCKED" if r["locked"] else ""
                    print(
                        f"{r['route']}: {r['state']}{lock} target={r['target'] or '-'} "
                        f"epoch={r['epoch']} pairs={r['pairs_seen']} last={r['last_decision']}"
                    )
                if not rows:
                    print("no routes yet")
            return 0
        policy = load_policy(settings.policy_file).for_route(args.route)
        result = await store.manual(
            args.route, args.action, policy, time.time(), who=f"{getpass.getuser()}@cli"
        )
        otel.transitioned(result.outbox)
        published = await _publish(settings, store, args.route)
        after = result.state
        if after is None:  # only a duplicate fold has no state; manual steps never are
            raise BreakerStoreError(f"{args.route}: no state after {args.action}")
        if args.json:
            row = {
                "route": args.route,
                "action": args.action,
                "state": after.state,
                "target": after.target,
                "epoch": after.epoch,
                "locked": after.locked,
                "published": published,
            }
            print(json.dumps(row))
        else:
            print(
                f"{args.route}: {args.action} -> {after.state} target={after.target} "
                f"epoch={after.epoch}{' (locked)' if after.locked else ''}"
            )
        return 0
    finally:
        await client.aclose()


async def _publish(settings: Settings, store: RedisBreakerStore, route: str) -> bool:
    """Send the outbox now, through the same relay as the worker; False if it could not.

    If Kafka is down the Redis route key still steers gateways, and the worker's
    clock sends the queued command once the broker is back: a warning on stderr,
    not a failure.
    """
    # Deferred: aiokafka is only needed when a command is published.
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from quantdrift.breaker.outbox import OutboxItem
    from quantdrift.breaker.relay import OutboxRelay
    from quantdrift.kafka_clients import producer_kwargs

    producer = AIOKafkaProducer(**producer_kwargs(settings.kafka))
    topics = settings.kafka.topics

    async def send(item: OutboxItem) -> None:
        topic = topics.control if item.topic == "control" else topics.alerts
        await producer.send_and_wait(topic, key=route.encode(), value=item.value)

    relay = OutboxRelay(store, send, owner=f"cli:{os.getpid()}")
    try:
        await asyncio.wait_for(producer.start(), timeout=10)
    except (TimeoutError, OSError, KafkaError) as exc:
        _warn(f"could not publish to Kafka ({type(exc).__name__}); the Redis route key is set")
        with contextlib.suppress(Exception):
            await producer.stop()
        return False
    try:
        if await relay.flush(route) == 0 and relay.stats.send_failures:
            _warn("could not publish to Kafka; the Redis route key is set")
            return False
        return True
    finally:
        await producer.stop()


def _warn(message: str) -> None:
    """A warning on stderr: stdout holds only the result (one JSON document with --json)."""
    sys.stderr.write(f"quantdrift: warning: {message}\n")
