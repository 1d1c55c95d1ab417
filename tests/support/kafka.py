"""Small Kafka helpers for integration tests: unique topics, produce, consume with a deadline.

Consumers here use no consumer group (``group_id=None``): on Tansu a group
join costs 3-5 s, while a group-less consumer reads from the first poll.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord


def unique_topic(name: str = "t") -> str:
    """A topic name no other test uses, so tests can share one session broker."""
    return f"qdtest.{name}.{uuid.uuid4().hex[:12]}"


async def produce(
    bootstrap: str,
    topic: str,
    messages: Iterable[tuple[bytes | None, bytes]],
    **producer_kwargs: Any,
) -> None:
    """Send ``(key, value)`` pairs and wait until the broker has them all."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **producer_kwargs)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in messages]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def consume_n(
    bootstrap: str,
    topic: str,
    n: int,
    *,
    timeout: float = 10.0,
    predicate: Callable[[ConsumerRecord[bytes, bytes]], bool] | None = None,
    strict: bool = True,
    **consumer_kwargs: Any,
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read ``n`` records (matching ``predicate``) from the start of ``topic`` within ``timeout``.

    With ``strict`` (default) a short read fails the test with how many
    arrived; otherwise the records seen so far are returned. Subscribing to a
    topic that does not exist yet makes Tansu auto-create it (4 partitions).
    """
    options: dict[str, Any] = {
        "group_id": None,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "fetch_max_wait_ms": 100,
        **consumer_kwargs,
    }
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, **options)
    got: list[ConsumerRecord[bytes, bytes]] = []
    deadline = time.monotonic() + timeout
    await consumer.start()
    try:
        while len(got) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            batches = await consumer.getmany(timeout_ms=int(min(left, 0.5) * 1000))
            for records in batches.values():
                got.extend(r for r in records if predicate is None or predicate(r))
    finally:
        await consumer.stop()
    if strict and len(got) < n:
        raise AssertionError(f"got {len(got)} of {n} messages from {topic} within {timeout}s")
    return got[:n] if strict else got
