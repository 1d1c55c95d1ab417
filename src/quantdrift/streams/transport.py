"""Faust's aiokafka transport with the fetch wait we choose.

faust-streaming hard-codes ``fetch_max_wait_ms=1500`` for worker consumers,
and Tansu holds a fetch for that long when no record is waiting, so every hop
of the guard loop could spend 1.5 s idle: more than the whole 1 s budget. This
transport sets the consumer's wait from ``KafkaSettings.fetch_max_wait_ms``.
Registered as the ``qdkafka://`` broker scheme.

It also rewinds partitions that have no committed offset when Faust seeks
back to committed offsets (see ``_ConsumerThread.seek_to_committed``).
"""

from __future__ import annotations

from collections.abc import Mapping
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

    async def seek_to_committed(self) -> Mapping[Any, int]:
        return await self.call_thread(self._seek_to_committed)

    async def _seek_to_committed(self) -> Mapping[Any, int]:
        """Faust's "seek back to committed", also for partitions with nothing committed.

        Records fetched while Faust's flow is paused (a rebalance in progress) are
        thrown away, and Faust then seeks back to the committed offsets to read them
        again. aiokafka only seeks where the committed offset is > 0, so a partition
        with no commit (a new group, expired offsets, a broker that lost its state)
        kept its advanced position: the discarded records were never read. Rewind
        those to the beginning, which is what ``consumer_auto_offset_reset="earliest"``
        means for them; the judge drops any pair it already counted.
        """
        consumer = self._ensure_consumer()
        committed = await consumer.seek_to_committed()
        uncommitted = [tp for tp, offset in committed.items() if not offset or offset < 0]
        if uncommitted:
            await consumer.seek_to_beginning(*uncommitted)
        return committed


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
