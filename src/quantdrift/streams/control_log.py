"""The control topic read whole, once: what the breaker decided, for a Redis that forgot.

The judge stage calls :func:`read_control` when Redis lost its data
(``breaker/reseed.py`` says why). No consumer group and nothing committed: it reads
every partition from the start up to the end offsets it found when it began, within
``timeout_s``, and returns the records' values in no particular order (each command
carries its route and epoch). A broker it cannot reach raises ``BrokerError``, a
read that does not finish in time ``TimeoutError``; the caller tries again later.
"""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from quantdrift.config import KafkaSettings
from quantdrift.kafka_clients import consumer_kwargs, reader_kwargs, start_client


async def read_control(kafka: KafkaSettings, topic: str, timeout_s: float = 15.0) -> list[bytes]:
    """Every value on ``topic`` up to its end offsets when the read began."""
    consumer = AIOKafkaConsumer(**reader_kwargs(consumer_kwargs(kafka), None))
    await start_client(consumer, kafka.bootstrap_servers)
    deadline = time.monotonic() + timeout_s
    try:
        numbers = consumer.partitions_for_topic(topic)
        if not numbers:
            await consumer.force_metadata_update()
            numbers = consumer.partitions_for_topic(topic)
        parts = [TopicPartition(topic, p) for p in sorted(numbers or ())]
        if not parts:
            return []
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        values: list[bytes] = []
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end within {timeout_s:g} s")
            for records in (await consumer.getmany(timeout_ms=300)).values():
                values.extend(r.value for r in records if r.value is not None)
        return values
    finally:
        await consumer.stop()
