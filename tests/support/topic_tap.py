"""A tap on the rig's topics: every record kept as it lands, across a broker that forgets.

The rig's broker keeps its topics in memory (Tansu's ``memory://`` storage), so a
restart erases them, and with them what the end-of-run checker audits. For a case
that restarts the broker, this tap on the observer reads every topic from offset 0
while the run goes on and keeps each record under its broker life (``generation``),
topic, partition and offset. The checker then audits what both lives of the broker
held, merged with a last read of the live broker to its end offsets (``merged``).

``restarted`` is called between the old broker's death and the new one's start:
the tap closes its consumer (nothing more can come from a dead broker) and reads the
next life from offset 0, so the new broker's offsets are never mistaken for the old
one's. Within a life a record read twice (a reconnect seeks to the start again) is
kept once. What the tap cannot see: a record the old broker acknowledged and lost
before the tap fetched it. The checker accounts for those from the gateway's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError


@dataclass(frozen=True)
class Tapped:
    """One record as the tap kept it."""

    generation: int
    topic: str
    partition: int
    offset: int
    value: bytes | None


@dataclass
class TopicTap:
    bootstrap: str
    topics: list[str]
    generation: int = 0
    reopened: int = 0  # consumers opened after an error within a life
    _records: dict[tuple[int, str, int, int], Tapped] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _switch: threading.Event = field(default_factory=threading.Event)
    _switched: threading.Event = field(default_factory=threading.Event)
    _reading: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    failure: BaseException | None = None  # what stopped the reading loop, if anything

    def start(self, timeout: float = 60.0) -> TopicTap:
        self._thread = threading.Thread(target=self._run, daemon=True, name="topic-tap")
        self._thread.start()
        self.wait_reading(timeout)
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # kept and raised to the test: it never dies silently
            self.failure = exc
            self._reading.set()
            self._switched.set()

    def _alive(self) -> None:
        if self.failure is not None:
            raise AssertionError(f"the topic tap stopped: {self.failure!r}")

    def restarted(self, timeout: float = 30.0) -> None:
        """The broker is dead and not yet back: close this life, read the next from 0."""
        self._reading.clear()
        self._switched.clear()
        self._switch.set()
        if not self._switched.wait(timeout):
            raise AssertionError("the topic tap did not let go of the dead broker")
        self._alive()

    def wait_reading(self, timeout: float = 60.0) -> None:
        """Until the tap reads the new broker's topics (all of them exist)."""
        if not self._reading.wait(timeout):
            raise AssertionError(f"the topic tap read nothing of the broker in {timeout}s")
        self._alive()

    def count(self, topic: str, generation: int | None = None) -> int:
        with self._lock:
            return sum(
                1
                for k in self._records
                if k[1] == topic and (generation is None or k[0] == generation)
            )

    def merged(self, topic: str, now: list[Any]) -> list[Tapped]:
        """What the tap kept of ``topic`` in every life, plus ``now`` (a read of the live
        broker to its end, as records with ``partition``, ``offset`` and ``value``),
        each record once, in (life, partition, offset) order."""
        self._alive()
        with self._lock:
            out = {k: v for k, v in self._records.items() if k[1] == topic}
            gen = self.generation
        for r in now:
            out.setdefault(
                (gen, topic, r.partition, r.offset),
                Tapped(gen, topic, r.partition, r.offset, r.value),
            )
        return [out[k] for k in sorted(out)]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    # -- the reading loop ------------------------------------------------------------------

    async def _main(self) -> None:
        while not self._stop.is_set():
            consumer = None
            try:
                consumer = await self._open()
                if consumer is not None:
                    await self._read(consumer, self.generation)
            except (KafkaError, OSError):
                self.reopened += 1
            finally:
                if consumer is not None:
                    await _close(consumer)
            if self._switch.is_set():
                self.generation += 1
                self._switch.clear()
                self._switched.set()
            elif consumer is None or not self._reading.is_set():
                await asyncio.sleep(0.2)

    async def _open(self) -> AIOKafkaConsumer | None:
        """A consumer on every partition of every topic from offset 0, or None while a
        topic is missing (the broker just came back and the topics are being made)."""
        if self._switch.is_set():
            return None
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            request_timeout_ms=5000,
        )
        try:
            await consumer.start()
        except BaseException:
            await _close(consumer)
            raise
        parts = []  # from the metadata of every topic that start() fetched (none named)
        for topic in self.topics:
            found = consumer.partitions_for_topic(topic)
            if not found:
                await _close(consumer)
                return None
            parts += [TopicPartition(topic, p) for p in found]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        return consumer

    async def _read(self, consumer: AIOKafkaConsumer, gen: int) -> None:
        self._reading.set()
        while not self._stop.is_set() and not self._switch.is_set():
            batches = await consumer.getmany(timeout_ms=100)
            with self._lock:
                for tp, records in batches.items():
                    for r in records:
                        key = (gen, tp.topic, tp.partition, r.offset)
                        self._records.setdefault(key, Tapped(*key, r.value))


async def _close(consumer: AIOKafkaConsumer) -> None:
    """Stop a consumer whose broker may be dead: aiokafka's fetcher then lets the
    cancellation of its own retry sleep escape ``stop``; that is not ours to carry."""
    with contextlib.suppress(KafkaError, OSError, asyncio.CancelledError):
        await consumer.stop()
