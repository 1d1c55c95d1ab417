"""Each gateway's shadow spend and share, reported to Redis for the worker's status page.

What shadowing spent on its upstreams (``shadow/spend.py``) and the share a route is
shadowed at now live in one gateway's memory; the status page is the worker's, and a
route is served by many gateways (and collectors). So every ``every_s`` each gateway
writes, per route it serves (extra candidates' route ids included), one small JSON key
(``schemas.keys.spend_key``) with a TTL of ``ttl_s``, and scores itself in the route's
``spenders_key`` sorted set, pruning members silent for longer than the TTL. The worker
reads the set, then the keys still alive, and sums them (``status/page.spend_view``):
a gateway that stops or dies drops out of the sum within ``ttl_s``, and one that
stops cleanly removes its keys at once.

A report is the meter's totals since the gateway started (the reference's tokens,
seconds and calls, teacher-forcing calls counted apart, the candidate's shadow calls),
not a rate: the page shows what the live gateways have spent, apart from user traffic.

Redis is never on a user's path: the reports are written by a background task; a write
that fails is counted (``write_errors``) and logged (the first, then every twentieth),
and the next one carries the totals again.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from quantdrift.gateway.control.redis_poll import RedisPoll
from quantdrift.schemas.keys import spend_key, spenders_key

if TYPE_CHECKING:
    from quantdrift.gateway.gateway_config import GatewayConfig

# One route's report: what ``SpendMeter.totals`` gives per side, plus the share now.
Reports = Callable[[], Mapping[str, Mapping[str, Any]]]

EVERY_S = 5.0
TTL_S = 30.0


def gateway_id() -> str:
    """This process's name in the reports: host, pid and a random tail (a restarted
    process in the same pid is another reporter)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class SpendReport(RedisPoll):
    """Writes this gateway's per-route reports every ``every_s`` (module docstring)."""

    what = "shadow spend reports"
    at_start = "the status page shows no spend from this gateway until one is written"
    keeping = "the next report carries the totals again"
    task_name = "spend-report"

    def __init__(
        self,
        config: GatewayConfig,
        redis_url: str,
        key_prefix: str,
        redis_options: Mapping[str, Any] | None = None,
        *,
        every_s: float = EVERY_S,
        ttl_s: float = TTL_S,
        name: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(config, redis_url, key_prefix, redis_options)
        if not 0 < every_s < ttl_s:
            raise ValueError(f"need 0 < every_s < ttl_s, got {every_s}, {ttl_s}")
        self._every_s, self._ttl_s = every_s, ttl_s
        self.name = name or gateway_id()
        self._clock = clock
        self._reports: Reports = dict
        self._written: set[str] = set()

    def bind(self, reports: Reports) -> None:
        """What to report: route -> its figures (the Gateway's, once it is composed)."""
        self._reports = reports

    @property
    def every_s(self) -> float:
        return self._every_s

    async def read(self, redis: aioredis.Redis) -> None:
        """One round of reports (the poll's step: this watch writes)."""
        now = self._clock()
        reports = self._reports()
        pipe = redis.pipeline(transaction=False)
        for route, figures in reports.items():
            body = orjson.dumps({"gateway": self.name, "at": now, **figures})
            pipe.set(spend_key(self._prefix, route, self.name), body, px=int(self._ttl_s * 1000))
            members = spenders_key(self._prefix, route)
            pipe.zadd(members, {self.name: now})
            pipe.zremrangebyscore(members, "-inf", now - self._ttl_s)
            pipe.pexpire(members, int(self._ttl_s * 1000))
        await pipe.execute()
        self._written = set(reports)

    async def stop(self) -> None:
        """Stop reporting and take this gateway's reports out of the sum (best effort: a
        Redis away now lets them expire within the TTL)."""
        await self.stop_task()
        redis = self._redis
        if redis is not None and self._written:
            try:
                pipe = redis.pipeline(transaction=False)
                for route in self._written:
                    pipe.delete(spend_key(self._prefix, route, self.name))
                    pipe.zrem(spenders_key(self._prefix, route), self.name)
                await pipe.execute()
            except (RedisError, OSError):
                pass  # they expire within ttl_s
        await super().stop()
