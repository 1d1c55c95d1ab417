"""The launch gate: a route's candidate stays at a canary share until its preflight verifies.

A route with ``preflight: {report: ...}`` in the gateway config serves its
candidate to at most ``canary_percent`` of requests until the report says
``go`` and carries enough valid approvals (``quantdrift preflight sign``),
checked with :func:`quantdrift.schemas.signoff.verify` under the gateway's
own signing key ring: the same rule as ``quantdrift preflight verify``, so a
report that verifies on the launcher's desk opens the gate and nothing else
does. The files are re-read every ``preflight_refresh_s``, so a second
signature opens the gate without a restart, and a report edited after it was
signed closes it again.

The verdict per route is kept here (I/O: reading files); the routing rule that
uses it is pure, in :func:`quantdrift.gateway.chain.routing.decide`
(``candidate_cap``). A route without a gate is never capped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from quantdrift.errors import ConfigError
from quantdrift.gateway.gateway_config import GatewayConfig, PreflightGateConfig
from quantdrift.schemas.ed25519 import TrustedKey
from quantdrift.schemas.signoff import read_approvals, verify
from quantdrift.supervision import Supervisor, cancelled

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GateStatus:
    """One gated route's last check: verified or not, and why not."""

    verified: bool
    problems: tuple[str, ...] = ()
    signers: tuple[str, ...] = ()
    checked_at: float = 0.0


@dataclass
class PreflightGate:
    """Per gated route: verified or capped at its canary share."""

    config: GatewayConfig
    keys: Mapping[str, TrustedKey]
    clock: Callable[[], float] = time.time
    status: dict[str, GateStatus] = field(default_factory=dict)
    supervisor: Supervisor = field(default_factory=Supervisor)
    _task: asyncio.Task[None] | None = None

    @cached_property
    def gates(self) -> dict[str, PreflightGateConfig]:
        """The gated routes (the config is frozen: computed once)."""
        return {r: rc.preflight for r, rc in self.config.routes.items() if rc.preflight}

    def cap(self, route: str) -> float | None:
        """The candidate's largest share (percent) for ``route``; None: not capped."""
        gate = self.gates.get(route)
        if gate is None:
            return None
        st = self.status.get(route)
        return None if st is not None and st.verified else gate.canary_percent

    def refresh(self) -> None:
        """Re-read every gated route's report and approvals; log each change of verdict.

        Anything short of a verified report, a read or verify error included, closes
        the gate (the candidate back to its canary share) at this refresh.
        """
        for route, gate in self.gates.items():
            new = self._check(gate)
            old = self.status.get(route)
            self.status[route] = new
            if old is None or old.verified != new.verified:
                if new.verified:
                    log.warning(
                        "preflight gate %s: report verified (signed by %s): candidate opened",
                        route,
                        ", ".join(new.signers),
                    )
                else:
                    log.warning(
                        "preflight gate %s: candidate held at %g %% (%s)",
                        route,
                        gate.canary_percent,
                        "; ".join(new.problems) or "not verified",
                    )

    def _check(self, gate: PreflightGateConfig) -> GateStatus:
        now = self.clock()
        try:
            raw = gate.report.read_bytes()
            approvals = read_approvals(gate.report)
        except OSError as exc:
            return GateStatus(False, (f"{gate.report}: {exc.strerror or exc}",), checked_at=now)
        except ConfigError as exc:
            return GateStatus(False, (str(exc),), checked_at=now)
        try:
            result = verify(
                raw,
                approvals,
                self.keys,
                required=gate.required_signers,
                distinct_keys=gate.distinct_keys,
            )
        except Exception as exc:  # a report replaced by `null`, garbage...: fail closed
            return GateStatus(False, (f"{gate.report}: unverifiable ({exc!r})"[:300],), (), now)
        problems = () if result.ok else tuple(result.problems)
        return GateStatus(result.ok, problems, tuple(result.signers), now)

    async def start(self) -> None:
        """Check now, then every ``preflight_refresh_s`` (only when a route is gated)."""
        if not self.gates:
            return
        self.refresh()
        if self._task is None:
            self._task = self.supervisor.spawn("preflight-gate", self._loop)

    async def stop(self) -> None:
        await cancelled(self._task)
        self._task = None

    async def _loop(self) -> None:
        # A bug here is the supervisor's to log, count and restart; _check never raises.
        while True:
            await asyncio.sleep(self.config.preflight_refresh_s)
            self.refresh()

    def health(self, private: bool = True) -> dict[str, dict[str, object]]:
        """Per gated route: verified, canary share; signers and problems only when
        ``private`` (an authenticated admin), since they name people and files."""
        out: dict[str, dict[str, object]] = {}
        for route, st in self.status.items():
            if route not in self.gates:
                continue
            out[route] = {
                "verified": st.verified,
                "canary_percent": self.gates[route].canary_percent,
            }
            if private:
                out[route]["signers"] = list(st.signers)
                out[route]["problems"] = list(st.problems)
        return out
