"""What serves each pool, and whether it teacher-forces as declared: the shadow
runner's probes, apart from its queue.

At start, then every ``PROBE_EVERY_S``, each pool's engine identity (engine,
version, served model) is read; a change under a running gateway is logged and
counted (``engine_changes``): pairs after it are about another candidate, and the
breaker restarts the route's evidence on the same change (``EngineInfo.identity``,
one definition). Once per teacher-forcing reference pool, whether it can do what it
declared: a pool that cannot is logged once, clearly, and shown as 0 in
``teacher_forcing_ready``; one that does not answer yet is tried again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.gateway.telemetry import counter, gauge
from quantdrift.gateway.upstream.pools import Upstreams
from quantdrift.gateway.upstream.teacher_forcing import UNSUPPORTED, Scored
from quantdrift.schemas.pair import EngineInfo

log = logging.getLogger("quantdrift.gateway.shadow.runner")

PROBE_EVERY_S = 30.0


class PoolProbe:
    """Each pool's identity and teacher-forcing readiness (module docstring)."""

    def __init__(self, config: GatewayConfig, upstreams: Upstreams) -> None:
        self.config = config
        self.upstreams = upstreams
        self.identities: dict[str, EngineInfo] = {}
        self.tf_ready: dict[str, float] = {}  # 1/0 per pool; absent while unknown
        self.engine_changes: dict[str, int] = {}

    @property
    def tf_pools(self) -> set[str]:
        """The reference pools of teacher-forced routes."""
        return {rc.reference for rc in self.config.routes.values() if rc.teacher_forced}

    async def loop(self) -> None:
        while True:
            for name in self.config.order:
                try:
                    pool = self.upstreams[name]
                    self.identified(name, await pool.identify())
                    if name in self.tf_pools and name not in self.tf_ready:
                        await self._probe_tf(name)
                except Exception:  # a probe must never take the loop down
                    log.exception("probe of pool %s failed", name)
            await asyncio.sleep(PROBE_EVERY_S)

    def identified(self, name: str, now: EngineInfo) -> None:
        """Keep a pool's identity; log and count a change of engine, version or model."""
        before = self.identities.get(name)
        self.identities[name] = now
        current = now.identity()
        if before is not None and current is not None and before.identity() != current:
            self.engine_changes[name] = self.engine_changes.get(name, 0) + 1
            log.warning(
                "pool %s now served by %s %s (%s), was %s %s (%s): pairs from here on are "
                "about another engine or model",
                name,
                now.engine,
                now.version,
                now.model,
                before.engine,
                before.version,
                before.model,
            )

    async def _probe_tf(self, name: str) -> None:
        outcome = await self.upstreams[name].probe_teacher_forcing(timeout_s=10.0)
        mode = self.config.pool(name).teacher_forcing
        if isinstance(outcome, Scored):
            self.tf_ready[name] = 1.0
            log.info("teacher forcing (%s) on pool %s: ready", mode, name)
        elif outcome.reason == UNSUPPORTED:
            self.tf_ready[name] = 0.0
            log.error(
                "teacher forcing (%s) on pool %s is not supported by its server: %s; "
                "teacher-forced routes on it get no tf_kl (set pools.%s.teacher_forcing "
                "to what the server is: vllm or lab)",
                mode,
                name,
                outcome.detail,
                name,
            )

    def collect(self) -> Iterator[Any]:
        yield gauge(
            "teacher_forcing_ready",
            "1 when the pool's server teacher-forces as declared, 0 when it cannot",
            ["pool", "mode"],
            {(p, self.config.pool(p).teacher_forcing): v for p, v in self.tf_ready.items()},
        )
        yield counter(
            "engine_changes",
            "times a pool's engine, version or served model changed under the gateway",
            ["pool"],
            {(p,): n for p, n in self.engine_changes.items()},
        )
