"""OutboxRelay: claim, send, ack — the one protocol that publishes a route's outbox.

Only the claim holder sends and trims; the trim is checked inside Lua against
the claim token (``outbox_ack.lua``), so a worker whose claim expired while it
stalled cannot trim what the next claimant queued. Delivery is at least once:
a crash between send and ack leaves the items for the next claim, and gateways
drop the repeated command on its epoch, alert sinks on its dedupe key.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from quantdrift.breaker.outbox import OutboxItem
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.errors import BreakerStoreError

log = logging.getLogger(__name__)

Send = Callable[[OutboxItem], Awaitable[None]]


@dataclass(slots=True)
class RelayStats:
    """Counters for the status page and tests."""

    flushes: int = 0
    sent: int = 0
    acked: int = 0
    fenced: int = 0
    send_failures: int = 0
    store_errors: int = 0


class OutboxRelay:
    """Publishes a route's outbox through ``send``, which returns once the broker has it."""

    def __init__(
        self,
        store: BreakerStore,
        send: Send,
        owner: str,
        ttl_ms: int = 10_000,
        failpoint: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._send = send
        self._owner = owner
        self._ttl_ms = ttl_ms
        self._failpoint = failpoint or (lambda name: None)
        self.stats = RelayStats()

    async def flush(self, route: str) -> int:
        """Send what the route's outbox holds; the number of items acknowledged.

        Never raises on a store or broker failure: the items stay queued and the
        next flush (the worker's clock, every 0.5 s) retries them.
        """
        self.stats.flushes += 1
        try:
            claim = await self._store.claim(route, self._owner, self._ttl_ms)
        except BreakerStoreError as exc:
            self.stats.store_errors += 1
            log.warning("outbox of %s not claimed (%s)", route, exc)
            return 0
        if claim is None:
            return 0
        try:
            for item in claim.items:
                await self._send(item)
                self.stats.sent += 1
        except Exception as exc:  # the broker's errors vary by client; all mean "retry"
            self.stats.send_failures += 1
            log.warning("outbox of %s not delivered yet (%r)", route, exc)
            try:
                await self._store.release(claim)
            except BreakerStoreError:
                self.stats.store_errors += 1
            return 0
        self._failpoint("after_send")
        try:
            acked = await self._store.ack(claim)
        except BreakerStoreError as exc:
            self.stats.store_errors += 1
            log.warning("outbox of %s sent but not acknowledged (%s)", route, exc)
            return 0
        if not acked:
            # Our claim expired while we sent: the items stay for the holder to trim.
            self.stats.fenced += 1
            log.warning("outbox of %s: claim expired before the ack; not trimmed", route)
            return 0
        self.stats.acked += len(claim.items)
        return len(claim.items)
