"""Which routes Redis knows, and whether it still remembers them.

Two global keys beside the per-route ones (``schemas/keys.py``):

* the routes set, which every worker's clock walks to tick each route. A route is
  added once per process and again at every transition, so a Redis that lost the
  set gets it back by the next transition at the latest;
* the ``alive`` marker, written once the states are known. Its absence is how a
  worker learns that Redis came back empty, and rebuilds the routes that were rolled
  back from the control topic (``breaker/reseed.py``, ``streams/control_log.py``).

Apart from the store because neither key is part of a route's Lua steps: both are
written outside them, and read by the clock, not by the fold.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from quantdrift.breaker.redis_io import redis_errors
from quantdrift.schemas.keys import alive_key, routes_key


class RouteRegistry:
    """The routes set and the ``alive`` marker under one key prefix."""

    def __init__(self, client: aioredis.Redis, key_prefix: str) -> None:
        self._r = client
        self._p = key_prefix
        self._registered: set[str] = set()

    async def routes(self) -> list[str]:
        with redis_errors():
            members = await self._r.smembers(routes_key(self._p))
        return sorted(m.decode() if isinstance(m, bytes) else m for m in members)

    async def register(self, route: str, force: bool = False) -> None:
        """Add the route to the routes set: once per process unless ``force``d (after
        a transition or a rebuild)."""
        if route in self._registered and not force:
            return
        with redis_errors():
            await self._r.sadd(routes_key(self._p), route)
        self._registered.add(route)

    async def remembers(self) -> bool:
        """Whether Redis still holds what the breaker wrote (the ``alive`` key is there)."""
        with redis_errors():
            return bool(await self._r.exists(alive_key(self._p)))

    async def remember(self) -> None:
        """Mark Redis as holding every route's state (after a rebuild, or a first start)."""
        with redis_errors():
            await self._r.set(alive_key(self._p), b"1")
