"""Where the adaptive share's inputs come from: the breaker's state in Redis, the meter.

``EvidenceWatch`` reads each adaptive route's state (``{prefix}route:{R}:state``, field
``s``, the breaker's own key) every ``adaptive_share.refresh_s`` and keeps what
``share.evidence_of`` reads of it. It fails towards the thin side: a route whose state
could not be read yet counts as unknown (the share's ``max``, still under the cap), and a
Redis that goes away keeps the last evidence read.

``ShareGovernor`` holds each route's bucket and window (``share.Meter``) and answers
``share(route)`` per request: it counts the request, reads what shadowing spent on the
reference so far (a callable over the ``SpendMeter``, which lives in ``shadow/``), and
calls the pure ``share.decide``. The clock is a parameter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import redis.asyncio as aioredis

from quantdrift.gateway.control.redis_poll import RedisPoll
from quantdrift.gateway.control.share import (
    Evidence,
    Meter,
    Share,
    ShareRule,
    decide,
    evidence_of,
    meter,
)
from quantdrift.gateway.gateway_config import AdaptiveShareConfig, GatewayConfig
from quantdrift.schemas.keys import route_key

log = logging.getLogger(__name__)

Spent = Callable[[str], tuple[int, int]]  # route -> (reference tokens, shadow jobs)


def rule_of(cfg: AdaptiveShareConfig) -> ShareRule:
    return ShareRule(
        floor=cfg.floor,
        max=cfg.max,
        cap_reference_tps=cfg.cap_reference_tps,
        burst_s=cfg.burst_s,
        slice_want=cfg.slice_want,
        calm=cfg.calm,
        window_s=cfg.window_s,
    )


def parse_state(raw: bytes | str | None) -> Evidence:
    """A state hash's ``s`` field as evidence; unreadable JSON counts as unknown."""
    if not raw:
        return Evidence()
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Evidence()
    return evidence_of(data if isinstance(data, Mapping) else None)


class EvidenceWatch(RedisPoll):
    """Each adaptive route's evidence, refreshed from the breaker's state in the background."""

    what = "route evidence"
    at_start = "shares at their max"
    keeping = "keeping it"
    task_name = "route-evidence"

    def clear(self) -> None:
        self.routes = [r for r in self.config.routes if self.config.adaptive(r) is not None]
        self.evidence: dict[str, Evidence] = {}

    def of(self, route: str) -> Evidence:
        return self.evidence.get(route) or Evidence()

    @property
    def active(self) -> bool:
        return bool(self.routes)

    @property
    def every_s(self) -> float:
        return min(a.refresh_s for r in self.routes if (a := self.config.adaptive(r)) is not None)

    async def read(self, redis: aioredis.Redis) -> None:
        pipe = redis.pipeline(transaction=False)
        for route in self.routes:
            pipe.hget(route_key(self._prefix, route, "state"), "s")
        values = await pipe.execute()
        for route, raw in zip(self.routes, values, strict=True):
            self.evidence[route] = parse_state(raw)


class ShareGovernor:
    """Each adaptive route's share now (module docstring); None for a flat route."""

    def __init__(
        self,
        config: GatewayConfig,
        evidence: Callable[[str], Evidence],
        spent: Spent,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rules = {
            r: rule_of(a) for r in config.routes if (a := config.adaptive(r)) is not None
        }
        self._evidence = evidence
        self._spent = spent
        self._clock = clock
        self._meters: dict[str, Meter] = {}
        self.last: dict[str, Share] = {}

    @property
    def routes(self) -> list[str]:
        return list(self._rules)

    def share(self, route: str, requests: int = 1) -> float | None:
        """The route's share for a request now (``requests``: how many this call counts)."""
        rule = self._rules.get(route)
        if rule is None:
            return None
        tokens, jobs = self._spent(route)
        m = meter(rule, self._meters.get(route, Meter()), self._clock(), tokens, jobs, requests)
        self._meters[route] = m
        now = decide(rule, self._evidence(route), m)
        was = self.last.get(route)
        if was is None or was.reason != now.reason:
            log.info("route %s: adaptive shadow share %.2f%% (%s)", route, 100 * now.share,
                     now.reason)  # fmt: skip
        self.last[route] = now
        return now.share

    def view(self, route: str) -> dict[str, Any] | None:
        """What ``/health`` shows of the route's share (without counting a request)."""
        rule = self._rules.get(route)
        if rule is None:
            return None
        share = self.share(route, requests=0)
        last = self.last[route]
        ev = self._evidence(route)
        return {
            "share": share,
            "reason": last.reason,
            "want": round(last.want, 4),
            "floor": rule.floor,
            "max": rule.max,
            "cap_reference_tps": rule.cap_reference_tps,
            "bucket_tokens": None if last.bucket is None else round(last.bucket, 1),
            "evidence": {
                "state": ev.state,
                "pairs": ev.pairs,
                "armed": ev.armed,
                "progress": ev.progress,
                "short_slices": ev.short_slices,
                "slices": ev.slices,
            },
        }
