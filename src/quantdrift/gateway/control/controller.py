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
two sources (``followers.py``) and keeps what the fence returns. Bad bytes and refused commands are
counted by reason and logged, never raised: the route keeps what it served.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from redis.exceptions import RedisError

from quantdrift.config import KafkaSettings
from quantdrift.errors import SchemaError, SignatureError
from quantdrift.gateway.control.fence import AppliedCommand, AppliedSlice, Refusal, fence
from quantdrift.gateway.control.followers import (
    ControllerStats,
    Liveness,
    RedisFollower,
    TopicFollower,
    command_key,
)
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.signing import CommandVerifier
from quantdrift.supervision import Supervisor

log = logging.getLogger(__name__)

Callback = Callable[[str, RouteCommand], Awaitable[None] | None]

__all__ = ["AppliedCommand", "ControllerStats", "RouteController", "command_key"]


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
        self.verifier = verifier
        self.default_target = default_target
        self._clock = clock
        self._wall_clock = wall_clock
        self._resolve = resolve or (lambda command: command.target)
        # The slice tags this gateway computes for every request: a command holding a
        # slice on any other tag is refused (none: every slice command is refused).
        self.slice_dimensions = frozenset(slice_dimensions)
        self._targets: dict[str, AppliedCommand] = {}
        self._callbacks: list[Callback] = []
        self._changed = asyncio.Condition()
        self._apply_lock = asyncio.Lock()
        self._live = Liveness(set(routes), clock=clock)
        self.stats: ControllerStats = self._live.stats
        self._topic = TopicFollower(
            kafka, control_topic or kafka.topics.control, verifier, self.handle, self._live
        )
        # SCAN walks the whole keyspace (dedupe keys included), so by default it runs
        # every 10 polls; known routes are read every poll with one MGET.
        self._redis = RedisFollower(
            redis_url,
            key_prefix,
            self.handle,
            self._live,
            poll_interval_s,
            10 * poll_interval_s if scan_interval_s is None else scan_interval_s,
            redis_options,
        )
        self._tasks: list[asyncio.Task[None]] = []
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
        return self._live.kafka_ready.is_set()

    @property
    def backstop_known(self) -> bool:
        """True once the Redis keys were read or the control topic was replayed, once.

        Before that a route's latest command (a locked rollback, say) may be unknown,
        so the gateway serves such routes their reference (see ``Gateway.directive``).
        """
        return self._live.backstop.is_set()

    def verified_age(self) -> float | None:
        """Seconds since either control source last answered; None before either did.

        A silent partition stops both: the Redis poll times out, and the topic's
        consumer gets no fetch answers (``last_poll_timestamp`` stops moving) while
        aiokafka keeps retrying without a word. ``Gateway.directive`` fails closed past
        ``control_stale_s``: the applied state may be stale, and a rollback may be
        waiting on the other side of the partition.
        """
        verified = self._live.verified
        if not verified:
            return None
        return self._clock() - max(verified.values())

    def on_change(self, cb: Callback) -> None:
        """Call ``cb(route, command)`` after each applied command (sync or async).

        Callbacks run in order, one command at a time; they must not call ``apply``.
        """
        self._callbacks.append(cb)

    def watch(self, route: str) -> None:
        """Poll this route's Redis key from now on, without waiting for a SCAN."""
        self._live.known.add(route)

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
                await self._live.backstop.wait()
        except TimeoutError:
            return False
        return True

    async def wait_kafka_ready(self, timeout: float) -> bool:
        """True once the control topic is being followed; False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._live.kafka_ready.wait()
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
        self._redis.connect()
        # A restarting gateway must not serve a rolled-back candidate until the first poll.
        try:
            async with asyncio.timeout(3.0):
                await self._redis.poll(scan=True)
        except (RedisError, OSError, TimeoutError) as exc:
            self.stats.redis_errors += 1
            log.warning("route keys not readable at start (%r); following the topic", exc)
        self._tasks = [
            self.supervisor.spawn("control-topic", self._topic.run),
            self.supervisor.spawn("control-redis", self._redis.run),
        ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._redis.close()
        self._live.kafka_ready.clear()

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
            self._live.known.add(command.route)
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
            # Counted in the line too: a follower (nginx) has no metrics page to show it.
            log.error(
                "refused %s command (%s, %d so far), route keeps its target: %s",
                source,
                refusal.reason,
                refused[refusal.reason],
                refusal.message,
            )
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
