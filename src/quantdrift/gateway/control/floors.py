"""How full each route's noise floor is, read from Redis: what ``noise_fill`` acts on.

A route whose divergence tests lack a floor is only partly armed until enough noise
pairs (two reference runs of one request) have been folded into it. The gateway is
what makes noise pairs, so it is what can make them faster: ``FloorWatch`` reads each
route's *sampled* floor (``schemas.keys.noise_key``, the breaker's own key) every
``refresh_s`` and says which routes are still filling; planning then samples those
routes' sampled requests for noise at ``noise_fill.max_rate``
(``GatewayConfig.noise_rate``).

Read-only, and it fails towards the configured share: a route whose floor could not
be read yet is not raised (reference capacity is the users' too), and a Redis that
goes away keeps the last counts it read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
import redis.asyncio as aioredis

from quantdrift.detectors.noise_floor import FLOOR_METRICS
from quantdrift.gateway.control.redis_poll import RedisPoll
from quantdrift.schemas.keys import noise_key

log = logging.getLogger(__name__)
MODE = "sampled"


def floor_size(raw: bytes | str | None) -> int:
    """Noise pairs in a floor's JSON: the longest metric's values (every noise pair has
    ROUGE-L; blessed values are not noise pairs).

    >>> floor_size(b'{"rougeL": [0.5, 0.6], "tf_kl": [0.1], "blessed:rougeL": [1, 2, 3]}')
    2
    >>> floor_size(None)
    0
    """
    if not raw:
        return 0
    data: Any = orjson.loads(raw)
    if not isinstance(data, Mapping):
        return 0
    sizes = [len(v) for k, v in data.items() if k in FLOOR_METRICS and isinstance(v, list)]
    return max(sizes, default=0)


class FloorWatch(RedisPoll):
    """Each route's sampled noise floor size, refreshed in the background."""

    what = "noise floors"
    at_start = "noise shares as configured"
    keeping = "keeping counts"
    task_name = "noise-floors"

    def clear(self) -> None:
        self.sizes: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.config.noise_fill.max_rate > 0

    def filling(self, route: str) -> bool:
        """Whether the route's sampled floor is known and still short of ``floor_pairs``."""
        size = self.sizes.get(route)
        return self.enabled and size is not None and size < self.config.noise_fill.floor_pairs

    def view(self, route: str) -> dict[str, Any]:
        """What /health shows: the floor's size against its target, and the share now."""
        return {
            "mode": MODE,
            "pairs": self.sizes.get(route),
            "floor_pairs": self.config.noise_fill.floor_pairs,
            "filling": self.filling(route),
            "noise_rate": self.config.noise_rate(route, self.filling(route)),
        }

    @property
    def active(self) -> bool:
        return self.enabled

    @property
    def every_s(self) -> float:
        return self.config.noise_fill.refresh_s

    async def read(self, redis: aioredis.Redis) -> None:
        routes = list(self.config.routes)
        pipe = redis.pipeline(transaction=False)
        for route in routes:
            pipe.hget(noise_key(self._prefix, route, MODE), "s")
        values = await pipe.execute()
        for route, raw in zip(routes, values, strict=True):
            size = floor_size(raw)
            was = self.filling(route)
            self.sizes[route] = size
            if self.filling(route) != was:
                self._log_change(route, size)

    def _log_change(self, route: str, size: int) -> None:
        fill = self.config.noise_fill
        if self.filling(route):
            log.warning(
                "route %s: its sampled noise floor has %d of %d noise pairs; noise share "
                "raised to %.0f%% of sampled requests until it fills (noise_fill.max_rate)",
                route,
                size,
                fill.floor_pairs,
                100 * self.config.noise_rate(route, True),
            )
        else:
            log.info(
                "route %s: sampled noise floor filled (%d noise pairs); noise share back to %.1f%%",
                route,
                size,
                100 * self.config.noise_rate(route),
            )
