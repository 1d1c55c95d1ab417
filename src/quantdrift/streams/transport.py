"""Faust's aiokafka transport with the fetch wait we choose.

faust-streaming hard-codes ``fetch_max_wait_ms=1500`` for worker consumers,
and Tansu holds a fetch for that long when no record is waiting, so every hop
of the guard loop could spend 1.5 s idle: more than the whole 1 s budget. This
transport sets the consumer's wait from ``KafkaSettings.fetch_max_wait_ms``.
Registered as the ``qdkafka://`` broker scheme.
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as faust_aiokafka

FETCH_MAX_WAIT_MS = {"value": 20}


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads this when it builds its Fetcher at start().
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS["value"]
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


def register(fetch_max_wait_ms: int) -> str:
    """Register the scheme (idempotent) and return it for the broker URL."""
    FETCH_MAX_WAIT_MS["value"] = fetch_max_wait_ms
    TRANSPORTS.aliases["qdkafka"] = "quantdrift.streams.transport:Transport"
    return "qdkafka"
