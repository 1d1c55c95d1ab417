"""The RouteController's followers: the two sources a route's commands come from.

* :class:`TopicFollower` reads the control topic (the fast path, tens of ms), replayed
  from its start when it first connects, so a starting gateway knows every route's
  latest command even while Redis is down.
* :class:`RedisFollower` polls each route's Redis key, where the breaker mirrors the
  latest signed envelope: the backstop when the topic is unreachable or a command was
  published while this gateway was down.

Both hand raw envelopes to one ``handle`` (the controller's: open, then the pure
``fence.fence``) and report through one :class:`Liveness`: which routes are known,
when each source last answered, whether the topic is followed and whether every
route's latest command is known. Neither raises on a lost broker or Redis: they count,
log, back off and go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.exceptions import RedisError

from quantdrift.config import KafkaSettings
from quantdrift.errors import SchemaError, SignatureError
from quantdrift.kafka_clients import consumer_kwargs
from quantdrift.schemas.keys import COMMAND_KEY_GLOB, route_of_command_key
from quantdrift.schemas.keys import command_key as _command_key
from quantdrift.schemas.signing import CommandVerifier

log = logging.getLogger(__name__)

Handle = Callable[[bytes | str, str], Awaitable[bool]]

_GLOB_SPECIALS = "\\*?[]"


def command_key(key_prefix: str, route: str) -> str:
    """The Redis key holding a route's latest signed command (written by the breaker)."""
    return _command_key(key_prefix, route)


@dataclass(slots=True)
class ControllerStats:
    """Counters; refusals by reason live in ``verifier.refused``."""

    received: dict[str, int] = field(default_factory=lambda: {"kafka": 0, "redis": 0})
    applied: int = 0
    duplicates: int = 0
    bad_messages: int = 0
    callback_errors: int = 0
    kafka_errors: int = 0
    redis_errors: int = 0


@dataclass
class Liveness:
    """What the followers share with the controller: the routes known (polled by key),
    the counters, whether the topic is followed (``kafka_ready``), whether every route's
    latest command is known (``backstop``: the keys were read or the topic replayed
    once; until then the gateway fails closed) and when each source last proved it is
    being followed (``verified``, monotonic: a Redis poll that read the keys, a fetch
    answer from the control topic's broker)."""

    known: set[str]
    stats: ControllerStats = field(default_factory=ControllerStats)
    clock: Callable[[], float] = time.monotonic
    kafka_ready: asyncio.Event = field(default_factory=asyncio.Event)
    backstop: asyncio.Event = field(default_factory=asyncio.Event)
    verified: dict[str, float] = field(default_factory=dict)


class TopicFollower:
    """Follows the control topic: no consumer group, no commits, every gateway reads all."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        verifier: CommandVerifier,
        handle: Handle,
        live: Liveness,
    ) -> None:
        self._kafka = kafka
        self.topic = topic
        self._verifier = verifier
        self._handle = handle
        self.live = live
        self.stats = live.stats

    async def run(self) -> None:
        """Consume the control topic forever; reconnect with backoff on any failure.

        No consumer group and no commits: every gateway reads every command. A
        gateway that starts replays the topic from its beginning (``_replay``), so it
        knows every route's latest command even when Redis is down at the same time;
        the topic carries one small message per transition, so the replay is short.
        Partitions first seen later are read from the beginning too.
        """
        delay = 0.1
        positions: dict[TopicPartition, int] = {}
        while True:
            consumer = AIOKafkaConsumer(
                **consumer_kwargs(self._kafka),
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="latest",
            )
            try:
                await consumer.start()
                partitions = consumer.partitions_for_topic(self.topic)
                if not partitions:
                    # Topic not created yet: look again soon (a fresh consumer refetches
                    # metadata; aiokafka only tracks topics it was asked about).
                    await asyncio.sleep(1.0)
                    continue
                tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
                consumer.assign(tps)
                first_time = not positions
                for tp in tps:
                    if tp in positions:
                        consumer.seek(tp, positions[tp])
                    else:
                        await consumer.seek_to_beginning(tp)
                if first_time:
                    await self.replay(consumer)
                for tp in tps:
                    positions[tp] = await consumer.position(tp)
                self.live.kafka_ready.set()
                delay = 0.1
                fetched: list[int | None] = []
                while True:
                    batches = await consumer.getmany(timeout_ms=1000)
                    stamps = [consumer.last_poll_timestamp(tp) for tp in tps]
                    if stamps != fetched and all(t is not None for t in stamps):
                        self.live.verified["kafka"] = self.live.clock()  # a fetch answer came back
                    fetched = stamps
                    for tp, messages in batches.items():
                        for message in messages:
                            positions[tp] = message.offset + 1
                            if message.value is not None:
                                await self._handle(message.value, "kafka")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # KafkaError, OSError: keep trying, Redis covers us
                self.live.kafka_ready.clear()
                self.stats.kafka_errors += 1
                if self.stats.kafka_errors == 1 or self.stats.kafka_errors % 20 == 0:
                    log.warning(
                        "control topic %s unreachable at %s (%d errors): %r",
                        self.topic,
                        self._kafka.bootstrap_servers,
                        self.stats.kafka_errors,
                        exc,
                    )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(5.0, delay * 2)
            finally:
                with contextlib.suppress(Exception):
                    await consumer.stop()

    async def replay(self, consumer: AIOKafkaConsumer) -> None:
        """Read the topic from its start until a poll comes back empty; apply each route's
        newest verified command only.

        Positions are recorded by the caller only after this returns: a failure half-way
        replays again from the start rather than skip what was read but not applied.

        Only the newest: the Redis key holds the same, and applying history in order
        would move a route through every old state (and an old restore, refused as
        stale, would leave an older rollback standing for good).
        """
        newest: dict[str, tuple[int, bytes]] = {}
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            if not any(batches.values()):
                break
            for messages in batches.values():
                for message in messages:
                    if message.value is None:
                        continue
                    try:
                        command = self._verifier.open(message.value)
                    except (SchemaError, SignatureError):
                        self.stats.bad_messages += 1
                        continue
                    seen = newest.get(command.route)
                    if seen is None or command.epoch >= seen[0]:
                        newest[command.route] = (command.epoch, message.value)
        for _, raw in newest.values():
            await self._handle(raw, "kafka")
        if not self.live.backstop.is_set():
            log.info("control topic replayed: %d routes' latest commands known", len(newest))
        self.live.backstop.set()


class RedisFollower:
    """Polls every known route's key with one MGET, and SCANs for new routes now and then."""

    def __init__(
        self,
        url: str,
        key_prefix: str,
        handle: Handle,
        live: Liveness,
        poll_interval_s: float,
        scan_interval_s: float,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self._url = url
        self._options = dict(options or {})
        self._prefix = key_prefix
        self._handle = handle
        self.live = live
        self.stats = live.stats
        self._poll_interval = poll_interval_s
        self._scan_interval = scan_interval_s
        self._last_raw: dict[str, bytes] = {}
        self.client: aioredis.Redis | None = None

    def connect(self) -> None:
        self.client = aioredis.from_url(
            self._url, **{"socket_connect_timeout": 2.0, "socket_timeout": 2.0, **self._options}
        )

    async def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_scan = loop.time() + self._scan_interval
        failures = 0
        while True:
            scan = loop.time() >= next_scan
            try:
                await self.poll(scan=scan)
            except (RedisError, OSError) as exc:
                failures += 1
                self.stats.redis_errors += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning(
                        "route keys unreadable (%d tries), keeping targets: %r", failures, exc
                    )
                # Back off to 2 polls at most while Redis is down (targets stay as they
                # are): a healed link must be read again within the 2 s recovery target.
                await asyncio.sleep(self._poll_interval * min(2, 2 ** min(failures, 4)))
                continue
            if failures:
                log.info("route keys readable again after %d failed polls", failures)
            failures = 0
            if scan:
                next_scan = loop.time() + self._scan_interval
            await asyncio.sleep(self._poll_interval)

    async def poll(self, scan: bool) -> None:
        redis = self.client
        if redis is None:
            return
        if scan:
            prefix = "".join("\\" + c if c in _GLOB_SPECIALS else c for c in self._prefix)
            async for key in redis.scan_iter(match=f"{prefix}{COMMAND_KEY_GLOB}", count=500):
                name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
                found = route_of_command_key(self._prefix, name)
                if found is not None:
                    self.live.known.add(found)
        routes = sorted(self.live.known)
        values = await redis.mget([command_key(self._prefix, r) for r in routes]) if routes else []
        for route, value in zip(routes, values, strict=True):
            if value is None:
                continue
            raw = value if isinstance(value, bytes) else str(value).encode()
            # The key changes only at a transition: skip unchanged bytes, so a forged or
            # stale value is counted once, not every poll.
            if self._last_raw.get(route) == raw:
                continue
            self._last_raw[route] = raw
            await self._handle(raw, "redis")
        self.live.verified["redis"] = self.live.clock()
        self.live.backstop.set()
