"""RouteController: the gateway obeys signed RouteCommands within a second.

Two ways in, one gate. Commands arrive on the control topic (fast path, ~tens
of ms) and are mirrored by the breaker into a Redis key per route
(``{prefix}route:{ROUTE}:command``, the latest signed envelope), which the
controller polls as a backstop: if the topic is unreachable, or a command was
published while this gateway was down, the key still carries the route's
current command. Both paths go through the same gate: the envelope's signature
over the payload's exact bytes matches a known key, the epoch is newer than the
one applied for that route, ``issued_at`` is within the freshness window (a
stale command may only move users to the reference), and the target maps onto
one of this gateway's pools (``targets.py``), and a slice selector names a tag this
gateway computes. The gate itself is the pure ``fence.fence``; this module follows the
two sources and keeps what the fence returns. Bad bytes and refused commands are
counted by reason and logged, never raised: the route keeps what it served.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.exceptions import RedisError

from quantdrift.config import KafkaSettings
from quantdrift.errors import SchemaError, SignatureError
from quantdrift.gateway.control.fence import AppliedCommand, AppliedSlice, Refusal, fence
from quantdrift.kafka_clients import consumer_kwargs
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.keys import COMMAND_KEY_GLOB, route_of_command_key
from quantdrift.schemas.keys import command_key as _command_key
from quantdrift.schemas.signing import CommandVerifier
from quantdrift.supervision import Supervisor

log = logging.getLogger(__name__)

Callback = Callable[[str, RouteCommand], Awaitable[None] | None]

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


class RouteController:
    """Follows the control topic (replayed from its start), with the Redis key as backstop."""

    def __init__(
        self,
        kafka: KafkaSettings,
        redis_url: str,
        verifier: CommandVerifier,
        key_prefix: str = "qd:",
        control_topic: str | None = None,
        poll_interval_s: float = 0.5,
        default_target: str = "candidate",
        *,
        routes: Iterable[str] = (),
        scan_interval_s: float | None = None,
        redis_options: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        resolve: Callable[[RouteCommand], str] | None = None,
        slice_dimensions: Iterable[str] = (),
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self._kafka = kafka
        self._redis_url = redis_url
        self._redis_options = dict(redis_options or {})
        self.verifier = verifier
        self._prefix = key_prefix
        self._topic = control_topic or kafka.topics.control
        self._poll_interval = poll_interval_s
        # SCAN walks the whole keyspace (dedupe keys included), so by default it runs
        # every 10 polls; known routes are read every poll with one MGET.
        self._scan_interval = 10 * poll_interval_s if scan_interval_s is None else scan_interval_s
        self.default_target = default_target
        self._clock = clock
        self._wall_clock = wall_clock
        self._resolve = resolve or (lambda command: command.target)
        # The slice tags this gateway computes for every request: a command holding a
        # slice on any other tag is refused (none: every slice command is refused).
        self.slice_dimensions = frozenset(slice_dimensions)
        self._targets: dict[str, AppliedCommand] = {}
        self._known: set[str] = set(routes)
        self._last_raw: dict[str, bytes] = {}
        self._callbacks: list[Callback] = []
        self._changed = asyncio.Condition()
        self._apply_lock = asyncio.Lock()
        self._kafka_ready = asyncio.Event()
        # Set once every route's latest command is known: the Redis keys were read, or
        # the control topic was replayed to its end. Until then the gateway fails closed.
        self._backstop = asyncio.Event()
        # When each control source last proved it is being followed (monotonic): a
        # Redis poll that read the keys, a fetch answer from the control topic's broker.
        self._verified: dict[str, float] = {}
        self._redis: aioredis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.stats = ControllerStats()
        # Restarts a follower loop that raises; the gateway shares its own.
        self.supervisor = Supervisor()

    # -- reading ---------------------------------------------------------------

    def target(self, route: str) -> str | None:
        """The precision the route must serve; None = no command ever, serve the default."""
        applied = self._targets.get(route)
        return applied.target_precision if applied else None

    def serving(self, route: str) -> str:
        """``target(route)`` or, before any command, ``default_target``."""
        return self.target(route) or self.default_target

    def epoch(self, route: str) -> int:
        """Epoch of the last applied command; 0 before any."""
        applied = self._targets.get(route)
        return applied.epoch if applied else 0

    def state(self, route: str) -> AppliedCommand | None:
        return self._targets.get(route)

    def slices(self, route: str) -> tuple[AppliedSlice, ...]:
        """The route's slices held apart from it (a slice-scoped rollback, half-open)."""
        applied = self._targets.get(route)
        return applied.slices if applied else ()

    def applied_at(self, route: str) -> float | None:
        """Monotonic time the route's current command was applied (for switch latency)."""
        applied = self._targets.get(route)
        return applied.applied_at if applied else None

    def routes(self) -> list[str]:
        return sorted(self._targets)

    @property
    def kafka_ready(self) -> bool:
        """True once the consumer is positioned on every partition of the control topic.

        It stays True if the broker goes away later: aiokafka reconnects by itself and
        does not surface the loss to ``getmany`` (it only logs), so the Redis poll, not
        this flag, is what keeps the gateway following commands then.
        """
        return self._kafka_ready.is_set()

    @property
    def backstop_known(self) -> bool:
        """True once the Redis keys were read or the control topic was replayed, once.

        Before that a route's latest command (a locked rollback, say) may be unknown,
        so the gateway serves such routes their reference (see ``Gateway.directive``).
        """
        return self._backstop.is_set()

    def verified_age(self) -> float | None:
        """Seconds since either control source last answered; None before either did.

        A silent partition stops both: the Redis poll times out, and the topic's
        consumer gets no fetch answers (``last_poll_timestamp`` stops moving) while
        aiokafka keeps retrying without a word. ``Gateway.directive`` fails closed past
        ``control_stale_s``: the applied state may be stale, and a rollback may be
        waiting on the other side of the partition.
        """
        if not self._verified:
            return None
        return self._clock() - max(self._verified.values())

    def on_change(self, cb: Callback) -> None:
        """Call ``cb(route, command)`` after each applied command (sync or async).

        Callbacks run in order, one command at a time; they must not call ``apply``.
        """
        self._callbacks.append(cb)

    def watch(self, route: str) -> None:
        """Poll this route's Redis key from now on, without waiting for a SCAN."""
        self._known.add(route)

    async def wait_for(
        self,
        route: str,
        predicate: Callable[[RouteCommand], bool],
        timeout: float,
    ) -> RouteCommand:
        """Return the route's applied command once ``predicate`` holds; TimeoutError after."""
        async with asyncio.timeout(timeout), self._changed:

            def satisfied() -> bool:
                applied = self._targets.get(route)
                return applied is not None and predicate(applied.command)

            await self._changed.wait_for(satisfied)
            return self._targets[route].command

    async def wait_known(self, timeout: float) -> bool:
        """True once every route's latest command is known (``backstop_known``); False on
        timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._backstop.wait()
        except TimeoutError:
            return False
        return True

    async def wait_kafka_ready(self, timeout: float) -> bool:
        """True once the control topic is being followed; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._kafka_ready.wait()
        except TimeoutError:
            return False
        return True

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Read the Redis keys once (bounded), then follow topic and keys in the background.

        Never fails because Kafka or Redis is down: both are retried in the background
        and the gateway serves its last known (or default) targets meanwhile.
        """
        if self._tasks:
            return
        self._redis = aioredis.from_url(
            self._redis_url,
            **{"socket_connect_timeout": 2.0, "socket_timeout": 2.0, **self._redis_options},
        )
        # A restarting gateway must not serve a rolled-back candidate until the first poll.
        try:
            async with asyncio.timeout(3.0):
                await self._poll_redis(scan=True)
        except (RedisError, OSError, TimeoutError) as exc:
            self.stats.redis_errors += 1
            log.warning("route keys not readable at start (%r); following the topic", exc)
        self._tasks = [
            self.supervisor.spawn("control-topic", self._follow_topic),
            self.supervisor.spawn("control-redis", self._follow_redis),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._redis is not None:
            redis, self._redis = self._redis, None
            with contextlib.suppress(RedisError, OSError):
                await redis.aclose()
        self._kafka_ready.clear()

    # -- the gate --------------------------------------------------------------

    async def handle(self, raw: bytes | str, source: str = "kafka") -> bool:
        """Open, verify and apply one signed envelope; True if applied.

        Never raises on bad input: unreadable bytes, bad signatures, stale epochs,
        old ``issued_at`` and unmappable targets are counted and logged.
        """
        self.stats.received[source] = self.stats.received.get(source, 0) + 1
        try:
            command = self.verifier.open(raw)
        except SchemaError as exc:
            self.stats.bad_messages += 1
            log.warning("unreadable control message from %s: %s", source, exc)
            return False
        except SignatureError as exc:
            log.warning("refused %s command: %s", source, exc)
            return False
        return await self._apply(command, source)

    async def _apply(self, command: RouteCommand, source: str) -> bool:
        """Fence and apply a command whose signature was verified."""
        async with self._apply_lock:
            applied = fence(
                self._targets.get(command.route),
                command,
                now=self._clock(),
                wall_now=self._wall_clock(),
                verifier=self.verifier,
                resolve=self._resolve,
                dimensions=self.slice_dimensions,
                source=source,
            )
            if isinstance(applied, Refusal):
                self._refused(applied, source)
                return False
            self._targets[command.route] = applied
            self._known.add(command.route)
            self.stats.applied += 1
            where, pool = "", applied.target_precision
            if command.slice is not None:
                where = f" for slice {command.slice.key}"
                held = {h.key: h for h in applied.slices}.get(command.slice.key)
                pool = held.target_precision if held else pool
            log.info(
                "route %s: %s%s -> %s (epoch %d, via %s)",
                command.route,
                command.action,
                where,
                pool,
                command.epoch,
                source,
            )
            async with self._changed:
                self._changed.notify_all()
            await self._tell(command)
            return True

    def _refused(self, refusal: Refusal, source: str) -> None:
        """Count and log a command the fence refused; the route keeps what it served."""
        if refusal.reason == "duplicate":
            # The same command seen again (topic redelivery, the Redis mirror of what
            # the topic already brought): nothing to refuse, nothing to do.
            self.stats.duplicates += 1
            return
        refused = self.verifier.refused
        refused[refusal.reason] = refused.get(refusal.reason, 0) + 1
        if refusal.reason.startswith("unmappable"):
            log.error("refused %s command, route keeps its target: %s", source, refusal.message)
        else:
            log.info("ignored %s command: %s", source, refusal.message)

    async def _tell(self, command: RouteCommand) -> None:
        """Call every listener in order; a broken one must not stop the controller."""
        for cb in list(self._callbacks):
            try:
                result = cb(command.route, command)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                self.stats.callback_errors += 1
                log.exception("on_change callback failed for route %s", command.route)

    # -- the control topic -----------------------------------------------------

    async def _follow_topic(self) -> None:
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
                partitions = consumer.partitions_for_topic(self._topic)
                if not partitions:
                    # Topic not created yet: look again soon (a fresh consumer refetches
                    # metadata; aiokafka only tracks topics it was asked about).
                    await asyncio.sleep(1.0)
                    continue
                tps = [TopicPartition(self._topic, p) for p in sorted(partitions)]
                consumer.assign(tps)
                first_time = not positions
                for tp in tps:
                    if tp in positions:
                        consumer.seek(tp, positions[tp])
                    else:
                        await consumer.seek_to_beginning(tp)
                if first_time:
                    await self._replay(consumer)
                for tp in tps:
                    positions[tp] = await consumer.position(tp)
                self._kafka_ready.set()
                delay = 0.1
                fetched: list[int | None] = []
                while True:
                    batches = await consumer.getmany(timeout_ms=1000)
                    stamps = [consumer.last_poll_timestamp(tp) for tp in tps]
                    if stamps != fetched and all(t is not None for t in stamps):
                        self._verified["kafka"] = self._clock()  # a fetch answer came back
                    fetched = stamps
                    for tp, messages in batches.items():
                        for message in messages:
                            positions[tp] = message.offset + 1
                            if message.value is not None:
                                await self.handle(message.value, "kafka")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # KafkaError, OSError: keep trying, Redis covers us
                self._kafka_ready.clear()
                self.stats.kafka_errors += 1
                if self.stats.kafka_errors == 1 or self.stats.kafka_errors % 20 == 0:
                    log.warning(
                        "control topic %s unreachable at %s (%d errors): %r",
                        self._topic,
                        self._kafka.bootstrap_servers,
                        self.stats.kafka_errors,
                        exc,
                    )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(5.0, delay * 2)
            finally:
                with contextlib.suppress(Exception):
                    await consumer.stop()

    async def _replay(self, consumer: AIOKafkaConsumer) -> None:
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
                        command = self.verifier.open(message.value)
                    except (SchemaError, SignatureError):
                        self.stats.bad_messages += 1
                        continue
                    seen = newest.get(command.route)
                    if seen is None or command.epoch >= seen[0]:
                        newest[command.route] = (command.epoch, message.value)
        for _, raw in newest.values():
            await self.handle(raw, "kafka")
        if not self._backstop.is_set():
            log.info("control topic replayed: %d routes' latest commands known", len(newest))
        self._backstop.set()

    # -- the Redis backstop ----------------------------------------------------

    async def _follow_redis(self) -> None:
        loop = asyncio.get_running_loop()
        next_scan = loop.time() + self._scan_interval
        failures = 0
        while True:
            scan = loop.time() >= next_scan
            try:
                await self._poll_redis(scan=scan)
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

    async def _poll_redis(self, scan: bool) -> None:
        redis = self._redis
        if redis is None:
            return
        if scan:
            prefix = "".join("\\" + c if c in _GLOB_SPECIALS else c for c in self._prefix)
            async for key in redis.scan_iter(match=f"{prefix}{COMMAND_KEY_GLOB}", count=500):
                name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
                found = route_of_command_key(self._prefix, name)
                if found is not None:
                    self._known.add(found)
        routes = sorted(self._known)
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
            await self.handle(raw, "redis")
        self._verified["redis"] = self._clock()
        self._backstop.set()
