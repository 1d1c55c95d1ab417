"""Publishing a route's outbox from the worker: the relay, its claim owner and one lock.

The judge flushes the routes a batch filled; the clock flushes every route (what
a failed flush left). Both go through :meth:`OutboxSender.flush`, one flush at a
time in this process; the relay's claim keeps other workers out
(``breaker/relay.py`` says why that makes each command published at least once
and trimmed only by its claim holder).
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Callable

from quantdrift.breaker.outbox import OutboxItem
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.breaker.relay import OutboxRelay
from quantdrift.failpoints import Failpoint, no_failpoint
from quantdrift.streams.app import Topics


class OutboxSender:
    """Sends queued commands to the control topic and alerts to the alerts topic."""

    def __init__(
        self,
        topics: Topics,
        store: Callable[[], BreakerStore],
        *,
        claim_ttl_ms: int = 10_000,
        failpoint: Failpoint = no_failpoint,
    ) -> None:
        self._topics = topics
        self._store = store
        self._claim_ttl_ms = claim_ttl_ms
        self._failpoint = failpoint
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._relay: OutboxRelay | None = None
        self._lock = asyncio.Lock()

    async def flush(self, route: str) -> None:
        """Publish what transitions queued; a failure leaves it for the clock to retry."""
        async with self._lock:
            await self._relay_once().flush(route)

    async def _send(self, item: OutboxItem) -> None:
        """Return once the broker has the record: the relay trims only after that."""
        topic = self._topics.control if item.topic == "control" else self._topics.alerts
        delivered = await topic.send(key=item.route.encode(), value=item.value)
        await delivered

    def _relay_once(self) -> OutboxRelay:
        if self._relay is None:
            self._relay = OutboxRelay(
                self._store(),
                self._send,
                self._owner,
                ttl_ms=self._claim_ttl_ms,
                failpoint=self._failpoint,
            )
        return self._relay
