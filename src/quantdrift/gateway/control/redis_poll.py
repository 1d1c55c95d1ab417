"""One background Redis task for the gateway's watches: readers of breaker keys, one writer.

``FloorWatch`` (noise floors) and ``EvidenceWatch`` (the adaptive share's evidence)
read different keys for different uses, but their lives are the same: open a client
with short socket timeouts, read once at start, then read every few seconds under a
supervisor, keeping the last values through a Redis that goes away and logging the
first failure and every twentieth. That life is this class; a watch says what it
reads (``read``), how often (``every_s``), whether it runs at all (``active``), and the
words its warnings use. The spend report (``spend_report.py``) lives the same life
and writes in its ``read`` step: its reports are the gateway's, the keys the worker's
status page reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from quantdrift.supervision import Supervisor, cancelled

if TYPE_CHECKING:
    from quantdrift.gateway.gateway_config import GatewayConfig

log = logging.getLogger(__name__)


class RedisPoll:
    """A watch's Redis client and polling task (module docstring)."""

    #: what the warnings call the values ("noise floors")
    what = "values"
    #: what holds while the first read fails ("noise shares as configured")
    at_start = "defaults hold"
    #: what a failed later read keeps ("keeping counts")
    keeping = "keeping the last read"
    #: the supervised task's name
    task_name = "redis-poll"

    def __init__(
        self,
        config: GatewayConfig,
        redis_url: str,
        key_prefix: str,
        redis_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self._url = redis_url
        self._prefix = key_prefix
        self._options = dict(redis_options or {})
        self.read_errors = 0
        self.supervisor = Supervisor()
        self._redis: aioredis.Redis | None = None
        self._task: asyncio.Task[None] | None = None
        self.clear()

    def clear(self) -> None:
        """Set what the watch holds before its first read (its own fields)."""

    @property
    def active(self) -> bool:
        """Whether there is anything to read (a watch with nothing to do opens no client)."""
        return True

    @property
    def every_s(self) -> float:
        raise NotImplementedError

    async def read(self, redis: aioredis.Redis) -> None:
        """One read of the watch's keys into its own state."""
        raise NotImplementedError

    async def start(self) -> None:
        if not self.active:
            return
        self._redis = aioredis.from_url(
            self._url, **{"socket_connect_timeout": 2.0, "socket_timeout": 2.0, **self._options}
        )
        try:
            await self.refresh()
        except (RedisError, OSError) as exc:
            self.read_errors += 1
            log.warning("%s unreadable at start (%r); %s", self.what, exc, self.at_start)
        self._task = self.supervisor.spawn(self.task_name, self._follow)

    async def stop_task(self) -> None:
        """Cancel the polling task, keeping the client (a last write on the way out)."""
        await cancelled(self._task)
        self._task = None

    async def stop(self) -> None:
        await self.stop_task()
        if self._redis is not None:
            redis, self._redis = self._redis, None
            await redis.aclose()

    async def refresh(self) -> None:
        if self._redis is not None:
            await self.read(self._redis)

    async def _follow(self) -> None:
        failures = 0
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.refresh()
                failures = 0
            except (RedisError, OSError) as exc:
                failures += 1
                self.read_errors += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("%s unreadable (%d tries), %s: %r",
                                self.what, failures, self.keeping, exc)  # fmt: skip
