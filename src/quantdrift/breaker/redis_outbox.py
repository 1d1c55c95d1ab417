"""The Redis outbox's claim: who may publish (and then trim) a route's queued messages.

The transition's Lua step (``store.py``) appends a route's command and alert to its
outbox list; these steps hand the list to one worker at a time, and trim only what
the holder of a live claim sent. Apart from the store because the claim is its own
protocol: a token, a TTL, and three Lua steps, none of which reads the route's state.
"""

from __future__ import annotations

import uuid
from importlib import resources

import redis.asyncio as aioredis

from quantdrift.breaker.outbox import OutboxItem
from quantdrift.breaker.protocol import Claim
from quantdrift.breaker.redis_io import redis_errors
from quantdrift.schemas.keys import route_key

_SCRIPTS = resources.files("quantdrift.breaker")
_CLAIM = _SCRIPTS.joinpath("outbox_claim.lua").read_text()
_ACK = _SCRIPTS.joinpath("outbox_ack.lua").read_text()
_RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


class RedisOutbox:
    """Claim, ack and release of a route's outbox, each one atomic Lua step."""

    def __init__(self, client: aioredis.Redis, key_prefix: str = "qd:") -> None:
        self._p = key_prefix
        self._claim_script = client.register_script(_CLAIM)
        self._ack_script = client.register_script(_ACK)
        self._release_script = client.register_script(_RELEASE)

    def _k(self, route: str, what: str) -> str:
        return route_key(self._p, route, what)

    async def claim(self, route: str, owner: str, ttl_ms: int = 10_000) -> Claim | None:
        """The outbox's items for ``owner`` alone; None when empty or another holds it.

        Every worker's clock looks at every route, so without a claim two workers
        would publish the same transition's command twice. The claim expires after
        ``ttl_ms``: a worker that dies mid-flush leaves the items to the next one
        (at least once; gateways drop a repeated epoch, sinks a repeated dedupe key).
        """
        token = f"{owner}:{uuid.uuid4().hex[:12]}"
        with redis_errors():
            raw = await self._claim_script(
                keys=[self._k(route, "outbox:owner"), self._k(route, "outbox")],
                args=[token, ttl_ms],
            )
        if not raw:
            return None
        return Claim(route, token, tuple(OutboxItem.parse(item, route) for item in raw))

    async def ack(self, claim: Claim, count: int | None = None) -> bool:
        """Trim what the claim sent and end it, inside Lua, only while the claim holds."""
        n = len(claim.items) if count is None else count
        with redis_errors():
            done = await self._ack_script(
                keys=[self._k(claim.route, "outbox:owner"), self._k(claim.route, "outbox")],
                args=[claim.token, n],
            )
        return bool(done)

    async def release(self, claim: Claim) -> None:
        with redis_errors():
            await self._release_script(
                keys=[self._k(claim.route, "outbox:owner")], args=[claim.token]
            )
