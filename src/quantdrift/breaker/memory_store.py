"""The in-memory twin of the Redis store: same protocol, same fold, dicts instead of Lua.

The store of replay, eval and calibrate (``breaker/offline.py`` drives it), of tests
of the relay and the agents without a Redis, and of the contract test
(``tests/contract/test_breaker_store.py``), which holds both stores to one behaviour.
Single-process only: "atomic" here means "no await inside a step".
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from quantdrift.breaker.machine import Decision, manual, tick
from quantdrift.breaker.outbox import OutboxItem, build_outbox
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.protocol import (
    BreakerStore,
    Claim,
    FoldResult,
    Prefix,
    StepMessages,
    step_messages,
)
from quantdrift.breaker.state import RouteState, Transition
from quantdrift.breaker.step import fold_many
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState
from quantdrift.schemas.score import ScoreEvent
from quantdrift.schemas.signing import CommandSigner

# A route not seen yet. States are frozen values, so one serves every lookup (a new
# RouteState per lookup costs more than the rest of a memory fold's bookkeeping).
_FRESH = RouteState()


@dataclass(slots=True)
class _Owner:
    token: str
    expires_at: float


@dataclass
class MemoryBreakerStore(BreakerStore):
    """Routes' states, floors, outboxes and claims in dicts; ``clock`` drives claim expiry."""

    signer: CommandSigner
    noise_floor: NoiseFloor = field(default_factory=NoiseFloor)
    clock: Callable[[], float] = time.monotonic
    states: dict[str, RouteState] = field(default_factory=dict)
    floors: dict[tuple[str, str], NoiseFloorState] = field(default_factory=dict)
    commands: dict[str, bytes] = field(default_factory=dict)
    outboxes: dict[str, list[bytes]] = field(default_factory=dict)
    owners: dict[str, _Owner] = field(default_factory=dict)
    seen: set[tuple[str, str, str]] = field(default_factory=set)
    dups: dict[str, int] = field(default_factory=dict)
    remembered: bool = False  # as Redis's ``alive`` key: set once the states are known

    async def read(self, route: str) -> tuple[RouteState, int]:
        return self.states.get(route, _FRESH), 0

    async def routes(self) -> list[str]:
        return sorted(self.states)

    async def latest_command(self, route: str) -> bytes | None:
        return self.commands.get(route)

    async def duplicates(self, route: str) -> int:
        return self.dups.get(route, 0)

    async def fold_prefix(
        self, route: str, batch: Sequence[ScoreEvent], policy: RoutePolicy, now: float
    ) -> Prefix:
        """The Redis store's prefix, dicts for its reads and commit (never a lost race)."""
        step = fold_many(
            policy,
            self.states.get(route, _FRESH),
            {mode: f for (r, mode), f in self.floors.items() if r == route},
            [(route, s.kind, s.pair_id) in self.seen for s in batch],
            batch,
            now,
            self.noise_floor,
        )
        self.seen.update((route, batch[i].kind, batch[i].pair_id) for i in step.marked)
        dups = step.outcomes.count(None)
        if dups:
            self.dups[route] = self.dups.get(route, 0) + dups
        for mode, floor in step.floors.items():
            self.floors[(route, mode)] = floor
        messages = step_messages(route, step, batch, self.signer, now)
        if step.state is not None:
            self._write(route, step.state, messages)
        return Prefix(messages.results(step), messages.outbox if not step.outcomes else None)

    async def read_floors(self, route: str) -> dict[str, NoiseFloorState]:
        return {m: f for (r, m), f in self.floors.items() if r == route and f.values}

    async def seed_floor(
        self, route: str, mode: str, values: list[dict[str, float]], merge: bool = False
    ) -> NoiseFloorState:
        floor = self.floors.get((route, mode)) if merge else None
        state = self.noise_floor.extend(floor or self.noise_floor.init(), values)
        self.floors[(route, mode)] = state
        return state

    async def remembers(self) -> bool:
        return self.remembered

    async def remember(self) -> None:
        self.remembered = True

    async def seed(self, route: str, rebuild: Callable[[RouteState], RouteState | None]) -> bool:
        new = rebuild(self.states.get(route, _FRESH))
        if new is None:
            return False
        self.states[route] = new
        return True

    async def tick(self, route: str, policy: RoutePolicy, now: float) -> FoldResult:
        return self._decide(route, tick(policy, self.states.get(route, _FRESH), now), now)

    def fork(self) -> MemoryBreakerStore:
        """An independent copy: what folds into one no longer moves the other.

        States and floors are values, so copying the dicts is enough; eval uses it to
        start several drifts from one healthy run (``evaluation/long.py``).
        """
        return replace(
            self,
            states=dict(self.states),
            floors=dict(self.floors),
            commands=dict(self.commands),
            outboxes={route: list(items) for route, items in self.outboxes.items()},
            owners=dict(self.owners),
            seen=set(self.seen),
            dups=dict(self.dups),
        )

    async def manual(
        self, route: str, action: str, policy: RoutePolicy, now: float, who: str = "cli"
    ) -> FoldResult:
        state = self.states.get(route, _FRESH)
        return self._decide(route, manual(policy, state, action, now, who), now, "manual")

    def _decide(
        self, route: str, decision: Decision, now: float, source: str = "breaker"
    ) -> FoldResult:
        current = self.states.get(route, _FRESH)
        if decision.transition is None and (decision.state is current or decision.state == current):
            return FoldResult("ok", decision.state)
        return self._commit(route, decision.state, decision.transition, now, source)

    def _commit(
        self,
        route: str,
        state: RouteState,
        transition: Transition | None,
        now: float,
        source: str,
    ) -> FoldResult:
        outbox = None
        if transition is not None:
            outbox = build_outbox(route, transition, state, self.signer, now, source)
        self._write(route, state, StepMessages(outbox))
        return FoldResult("ok", state, outbox)

    def _write(self, route: str, state: RouteState, messages: StepMessages) -> None:
        """The commit: the state, the latest command, and the queued messages."""
        self.states[route] = state
        if messages.outbox is not None:
            self.commands[route] = messages.outbox.sealed
        items = messages.items()
        if items:
            self.outboxes.setdefault(route, []).extend(items)

    async def claim(self, route: str, owner: str, ttl_ms: int = 10_000) -> Claim | None:
        held = self.owners.get(route)
        if held is not None and held.expires_at > self.clock():
            return None
        items = self.outboxes.get(route, [])
        if not items:
            self.owners.pop(route, None)
            return None
        token = f"{owner}:{uuid.uuid4().hex[:12]}"
        self.owners[route] = _Owner(token, self.clock() + ttl_ms / 1000)
        return Claim(route, token, tuple(OutboxItem.parse(i, route) for i in items))

    def _holds(self, claim: Claim) -> bool:
        held = self.owners.get(claim.route)
        return held is not None and held.token == claim.token and held.expires_at > self.clock()

    async def ack(self, claim: Claim, count: int | None = None) -> bool:
        if not self._holds(claim):
            return False
        n = len(claim.items) if count is None else count
        del self.outboxes[claim.route][:n]
        del self.owners[claim.route]
        return True

    async def release(self, claim: Claim) -> None:
        if self._holds(claim):
            del self.owners[claim.route]
