"""BoundedProducer: hand items to Kafka without ever slowing a user down.

The request path calls ``offer(item)``, which only puts the item on a bounded
in-process queue and returns. A background task encodes each item (the
``encode`` it was given: item -> (key, value) bytes) and drains the queue to
one topic. When Kafka is slow or gone the queue fills and further items are
dropped and counted: losing a shadow sample or a degradation event costs a
little, blocking a user request costs the user. Nothing is dropped silently;
every drop is in ``stats.dropped`` under its reason, and an item its encoder
refuses is one ``invalid`` drop, never a stalled queue.

What is published, and how it is encoded, is the caller's: the gateway builds
its pair and degradation publishers from this one class (``publisher.py``).

``offer`` must be called from the event loop the producer was started on
(asyncio queues are not thread-safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaProducer

from quantdrift.config import KafkaSettings
from quantdrift.errors import SchemaError
from quantdrift.kafka_clients import producer_kwargs
from quantdrift.supervision import Supervisor

log = logging.getLogger(__name__)

# Drop reasons, as they appear in PublisherStats.dropped.
QUEUE_FULL = "queue_full"
STOPPED = "stopped"
INVALID = "invalid"
STOP_TIMEOUT = "stop_timeout"
OFFER_ERROR = "offer_error"
BUG = "bug"  # the drain loop raised; the supervisor restarted it
SEND_ERROR = "send_error"  # stored as "send_error:<ExceptionName>"


T = TypeVar("T")
# item -> (key, value) for Kafka; raises SchemaError (or TypeError, ValueError,
# OverflowError, as orjson does) for an item that cannot travel.
Encoder = Callable[[T], tuple[bytes, bytes]]
_REFUSED = (SchemaError, TypeError, ValueError, OverflowError)


@dataclass(slots=True)
class PublisherStats:
    """Counters of a BoundedProducer; ``dropped`` holds every loss by reason."""

    offered: int = 0
    sent: int = 0
    failed: int = 0
    connect_failures: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def dropped_queue_full(self) -> int:
        """Read from ``dropped``: one count per reason, kept in one place."""
        return self.dropped.get(QUEUE_FULL, 0)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


class BoundedProducer(Generic[T]):
    """Queue items, encode them with ``encode``, send them to ``topic``.

    ``what`` names the items in log lines ("shadow pair", "degradation event").
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        encode: Encoder[T],
        *,
        queue_size: int = 10_000,
        max_in_flight: int = 1_000,
        log_every: int = 100,
        backoff_s: tuple[float, float] = (0.1, 5.0),
        what: str = "item",
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self._kafka = kafka
        self._topic = topic
        self._encode = encode
        self._what = what
        self._log_every = max(1, log_every)
        self._backoff = backoff_s
        self._queue: asyncio.Queue[T] = asyncio.Queue(queue_size)
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._closed = False
        self._connected = asyncio.Event()
        self.stats = PublisherStats()
        # Restarts the drain loop if it ever raises; the gateway shares its own.
        self.supervisor = Supervisor()

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def offer(self, item: T) -> bool:
        """Queue an item for sending; never blocks, never raises. False = dropped (counted)."""
        try:
            self.stats.offered += 1
            if self._closed:
                self.stats.drop(STOPPED)
                return False
            self._queue.put_nowait(item)
            return True
        except asyncio.QueueFull:
            self.stats.drop(QUEUE_FULL)
            if self.stats.dropped_queue_full % self._log_every == 1 or self._log_every == 1:
                log.warning(
                    "%s queue full (%d): %d dropped so far",
                    self._what,
                    self._queue.maxsize,
                    self.stats.dropped_queue_full,
                )
            return False
        except Exception:  # the user's request must not fail because of the mirror
            self.stats.drop(OFFER_ERROR)
            log.exception("offer failed; %s dropped", self._what)
            return False

    async def start(self) -> None:
        """Start the drain task; returns at once, Kafka is connected in the background."""
        if self._task is None:
            self._closed = False
            self._task = self.supervisor.spawn(f"publisher:{self._topic}", self._run)

    async def wait_connected(self, timeout: float) -> bool:
        """True once the producer is up (tests and health checks); False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self, timeout: float = 5.0) -> None:
        """Refuse new items, send what is queued for at most ``timeout`` s, then close.

        Items still queued when the time is up are counted as ``stop_timeout``.
        """
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        task, self._task = self._task, None
        if task is not None:
            # queue.join() covers queued items and those in flight (task_done on delivery).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    if not self._queue.empty():
                        await self._connected.wait()
                    await self._queue.join()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        left = self._queue.qsize()
        if left:
            self.stats.drop(STOP_TIMEOUT, left)
            log.warning("%s producer stopped with %d unsent", self._what, left)
            while not self._queue.empty():
                self._queue.get_nowait()
                self._queue.task_done()
        producer, self._producer = self._producer, None
        self._connected.clear()
        if producer is not None:
            # aiokafka's stop() waits for in-flight batches; with a dead broker that is up
            # to request_timeout_ms. Let it finish in the background past our deadline.
            closing = asyncio.create_task(producer.stop())
            done, _ = await asyncio.wait({closing}, timeout=max(0.1, deadline - loop.time()))
            if not done:
                log.warning("producer still closing after %.1f s; finishing in background", timeout)
                self._closing = closing

    # -- background ------------------------------------------------------------

    async def _run(self) -> None:
        # A restart after a crash keeps the producer it already has.
        producer = self._producer or await self._connect()
        while True:
            item = await self._queue.get()
            try:
                await self._send_one(producer, item)
            except asyncio.CancelledError:
                # Taken off the queue but never handed to the producer: say so.
                self.stats.drop(STOP_TIMEOUT)
                self._queue.task_done()
                raise
            except Exception:
                # _send_one owns the slot until it hands the item over; a bug before
                # that must not leave queue.join() waiting forever. The supervisor logs it.
                self.stats.drop(BUG)
                self._queue.task_done()
                raise

    async def _send_one(self, producer: AIOKafkaProducer, item: T) -> None:
        """Own one queue slot: ``task_done`` exactly once, here or on delivery."""
        try:
            key, value = self._encode(item)
        except _REFUSED as exc:
            # One poisoned item (e.g. an integer beyond 64 bits in a user's json_schema,
            # which orjson refuses to encode) is dropped and counted; the next is sent.
            self.stats.drop(INVALID)
            self._queue.task_done()
            log.warning("%s dropped, invalid: %s: %s", self._what, type(exc).__name__, exc)
            return
        await self._in_flight.acquire()
        try:
            future = await producer.send(self._topic, key=key, value=value)
        except asyncio.CancelledError:
            self._in_flight.release()
            raise
        except Exception as exc:  # KafkaError, timeouts: counted, never fatal
            self._in_flight.release()
            self._queue.task_done()
            self._failed(exc)
            return
        future.add_done_callback(self._delivered)

    def _delivered(self, future: asyncio.Future[Any]) -> None:
        self._in_flight.release()
        self._queue.task_done()
        if future.cancelled():
            self._failed(asyncio.CancelledError())
        elif (exc := future.exception()) is not None:
            self._failed(exc)
        else:
            self.stats.sent += 1

    def _failed(self, exc: BaseException) -> None:
        self.stats.failed += 1
        self.stats.drop(f"{SEND_ERROR}:{type(exc).__name__}")
        if self.stats.failed == 1 or self.stats.failed % self._log_every == 0:
            log.warning("%s not delivered (%d so far): %r", self._what, self.stats.failed, exc)

    async def _connect(self) -> AIOKafkaProducer:
        """Start a producer, retrying with capped, jittered backoff until it works."""
        low, high = self._backoff
        delay = low
        while True:
            producer = AIOKafkaProducer(**producer_kwargs(self._kafka))
            try:
                await producer.start()
            except asyncio.CancelledError:
                await producer.stop()
                raise
            except Exception as exc:  # KafkaConnectionError, OSError, auth errors
                await producer.stop()
                self.stats.connect_failures += 1
                if self.stats.connect_failures == 1 or self.stats.connect_failures % 20 == 0:
                    log.warning(
                        "%s producer cannot reach %s (attempt %d): %r",
                        self._what,
                        self._kafka.bootstrap_servers,
                        self.stats.connect_failures,
                        exc,
                    )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(high, delay * 2)
                continue
            self._producer = producer
            self._connected.set()
            return producer
