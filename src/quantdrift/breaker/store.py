"""The breaker's Redis store: read a route's state, fold, write back in one Lua step.

Optimistic concurrency: the Lua script writes only if the state's version is
the one that was read, and marks the pair as seen in the same step. Two
workers (or a redelivered batch) racing on one transition: one wins, the other
re-reads, finds the pair seen or folds onto the new state, so a transition
bumps the epoch once and yields exactly one command and one alert.

The key layout is in ``schemas/keys.py`` (gateways read the command key too);
every key of a route shares its hash tag, so each Lua step runs on one slot and
the store works on Redis Cluster. The two global keys, the routes set and the
``alive`` marker, are written outside the Lua steps (``redis_registry.py``); the
outbox's claim is ``redis_outbox.py``; the messages a commit queues are built by
``protocol.step_messages``, as in the memory store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import orjson
import redis.asyncio as aioredis

from quantdrift.breaker.machine import Decision, manual, tick
from quantdrift.breaker.outbox import Outbox, OutboxItem, build_outbox
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.protocol import (
    MAX_ATTEMPTS,
    BreakerStore,
    Claim,
    FoldResult,
    Prefix,
    step_messages,
)
from quantdrift.breaker.redis_io import decode_hash, redis_errors, status_text
from quantdrift.breaker.redis_outbox import RedisOutbox
from quantdrift.breaker.redis_registry import RouteRegistry
from quantdrift.breaker.state import RouteState, Transition
from quantdrift.breaker.step import DECODING_MODES, FoldedMany, floor_key_suffix, fold_many
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState
from quantdrift.errors import BreakerStoreError
from quantdrift.schemas.keys import noise_key, route_key, spend_key, spenders_key
from quantdrift.schemas.score import ScoreEvent
from quantdrift.schemas.signing import CommandSigner

_SCRIPTS = resources.files("quantdrift.breaker")
_APPLY = _SCRIPTS.joinpath("apply.lua").read_text()
_BATCH = _SCRIPTS.joinpath("fold_batch.lua").read_text()
# A redelivery comes from offsets folded but not yet committed (seconds), or from a
# producer retrying a send (seconds); an hour covers both with a wide margin and
# bounds Redis at ~one key per pair of the last hour.
DEFAULT_SEEN_TTL_S = 3600

__all__ = ["Claim", "FoldResult", "OutboxItem", "RedisBreakerStore"]


class RedisBreakerStore(BreakerStore):
    """Per-route breaker state in Redis; every method is safe to race."""

    def __init__(
        self,
        client: aioredis.Redis,
        signer: CommandSigner,
        key_prefix: str = "qd:",
        seen_ttl_s: int = DEFAULT_SEEN_TTL_S,
        noise_floor: NoiseFloor = NoiseFloor(),
        failpoint: Callable[[str], None] | None = None,
    ) -> None:
        self._r = client
        self._signer = signer
        self._p = key_prefix
        self._ttl = seen_ttl_s
        self._floor = noise_floor
        self._failpoint = failpoint or (lambda name: None)
        self._script = client.register_script(_APPLY)
        self._batch_script = client.register_script(_BATCH)
        self._outbox = RedisOutbox(client, key_prefix)
        self._registry = RouteRegistry(client, key_prefix)

    # -- keys -----------------------------------------------------------------
    def _k(self, route: str, what: str) -> str:
        return route_key(self._p, route, what)

    def command_key(self, route: str) -> str:
        return self._k(route, "command")

    def _floor_key(self, route: str, mode: str) -> str:
        return noise_key(self._p, route, mode)

    # -- reads ----------------------------------------------------------------
    async def read(self, route: str) -> tuple[RouteState, int]:
        return await self._read_hash(self._k(route, "state"), RouteState.from_json)

    async def read_floor(self, route: str, mode: str) -> tuple[NoiseFloorState, int]:
        return await self._read_hash(self._floor_key(route, mode), NoiseFloorState.from_json)

    async def routes(self) -> list[str]:
        return await self._registry.routes()

    async def latest_command(self, route: str) -> bytes | None:
        with redis_errors():
            raw = await self._r.get(self.command_key(route))
        if not raw:
            return None
        return raw if isinstance(raw, bytes) else str(raw).encode()

    async def duplicates(self, route: str) -> int:
        with redis_errors():
            raw = await self._r.hget(self._k(route, "stats"), "duplicates")
        return int(raw or 0)

    async def spend_reports(self, route: str) -> list[dict[str, Any]]:
        """The reports still alive of the gateways in the route's spenders set; a report
        that is not a JSON object is left out (a gateway's, not the breaker's, to fix)."""
        with redis_errors():
            names = await self._r.zrange(spenders_key(self._p, route), 0, -1)
            if not names:
                return []
            raws = await self._r.mget([spend_key(self._p, route, _text(n)) for n in names])
        reports = []
        for raw in raws:
            try:
                data = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                continue
            if isinstance(data, dict):
                reports.append(data)
        return reports

    async def _read_hash(self, key: str, build: Callable[[Any], Any]) -> tuple[Any, int]:
        with redis_errors():
            raw = await self._r.hmget(key, "v", "s")
        return decode_hash(raw, build)

    async def remembers(self) -> bool:
        return await self._registry.remembers()

    async def remember(self) -> None:
        await self._registry.remember()

    async def seed(self, route: str, rebuild: Callable[[RouteState], RouteState | None]) -> bool:
        """Replace the route's state by ``rebuild(state)`` unless that is None
        (``breaker/reseed.py``); whether it was written. Compare-and-set, retried on a
        lost race; nothing is sent (the gateways hold the command already)."""
        for _ in range(MAX_ATTEMPTS):
            state, version = await self.read(route)
            new = rebuild(state)
            if new is None:
                return False
            status, _ = await self._apply(
                self._k(route, "state"), version, orjson.dumps(new.to_json()), route, None, ()
            )
            if status != "conflict":
                await self._registry.register(route, force=True)
                return True
        raise BreakerStoreError(f"route {route}: gave up after {MAX_ATTEMPTS} write conflicts")

    # -- writes ---------------------------------------------------------------
    async def fold_prefix(
        self, route: str, batch: Sequence[ScoreEvent], policy: RoutePolicy, now: float
    ) -> Prefix | None:
        """Two Redis round trips for a prefix, not two per score; None on a lost race.

        One pipelined read (state, the floors the batch touches, whether each pair
        was seen), the pure fold in Python, one Lua commit that is compare-and-set on
        everything it read. ``fold`` and ``fold_batch`` (the protocol's) call this.
        """
        await self._registry.register(route)
        modes = sorted({floor_key_suffix(s) for s in batch})
        seen_keys = [self._k(route, f"seen:{s.kind}:{s.pair_id}") for s in batch]
        with redis_errors():
            pipe = self._r.pipeline(transaction=False)
            pipe.hmget(self._k(route, "state"), "v", "s")
            for mode in modes:
                pipe.hmget(self._floor_key(route, mode), "v", "s")
            for key in seen_keys:
                pipe.exists(key)
            raw = await pipe.execute()
        state, version = decode_hash(raw[0], RouteState.from_json)
        floors = {
            m: decode_hash(raw[1 + j], NoiseFloorState.from_json) for j, m in enumerate(modes)
        }
        already = [bool(x) for x in raw[1 + len(modes) :]]
        step = fold_many(
            policy, state, {m: f for m, (f, _) in floors.items()}, already, batch, now, self._floor
        )
        messages = step_messages(route, step, batch, self._signer, now)
        outbox, items = messages.outbox, messages.items()
        if outbox is not None:
            self._failpoint("before_commit")
        marked = [seen_keys[i] for i in step.marked]
        keys = [
            self._k(route, "state"),
            self.command_key(route),
            self._k(route, "outbox"),
            self._k(route, "stats"),
            *(self._floor_key(route, m) for m in modes),
            *marked,
        ]
        args = [len(modes), len(marked), self._ttl, *_batch_args(step, version, floors, outbox)]
        with redis_errors():
            status, _ = await self._batch_script(keys=keys, args=[*args, *items])
        if status_text(status) == "conflict":
            return None
        if outbox is not None:
            self._failpoint("after_commit")
        if items:
            await self._registry.register(route, force=True)
        return Prefix(messages.results(step), outbox if not step.outcomes else None)

    async def read_floors(self, route: str) -> dict[str, NoiseFloorState]:
        with redis_errors():
            pipe = self._r.pipeline(transaction=False)
            for mode in DECODING_MODES:
                pipe.hmget(self._floor_key(route, mode), "v", "s")
            raw = await pipe.execute()
        floors = {
            m: decode_hash(r, NoiseFloorState.from_json)[0]
            for m, r in zip(DECODING_MODES, raw, strict=True)
        }
        return {m: f for m, f in floors.items() if f.values}

    async def seed_floor(
        self,
        route: str,
        mode: str,
        values: list[dict[str, float]],
        merge: bool = False,
    ) -> NoiseFloorState:
        """Write a route's noise floor for one decoding mode (``quantdrift calibrate``).

        ``merge=False`` replaces the floor with ``values``; ``merge=True`` appends
        them to what is there. Compare-and-set on the floor's version, like
        ``fold``, so a worker folding a live noise pair at the same moment
        never loses its update or ours.
        """
        key = self._floor_key(route, mode)
        await self._registry.register(route)
        for _ in range(MAX_ATTEMPTS):
            floor, version = await self.read_floor(route, mode)
            state = self._floor.extend(floor if merge else self._floor.init(), values)
            status, _ = await self._apply(
                key, version, orjson.dumps(state.to_json()), route, None, ()
            )
            if status != "conflict":
                return state
        raise BreakerStoreError(
            f"noise floor {route}/{mode}: gave up after {MAX_ATTEMPTS} conflicts"
        )

    async def tick(self, route: str, policy: RoutePolicy, now: float) -> FoldResult:
        """Time-driven transitions (open -> half_open), raced safely by every worker."""
        return await self._decide(route, lambda s: tick(policy, s, now), now, "breaker")

    async def manual(
        self, route: str, action: str, policy: RoutePolicy, now: float, who: str = "cli"
    ) -> FoldResult:
        await self._registry.register(route)
        return await self._decide(
            route, lambda s: manual(policy, s, action, now, who), now, "manual"
        )

    async def _decide(
        self, route: str, decide: Callable[[RouteState], Decision], now: float, source: str
    ) -> FoldResult:
        for _ in range(MAX_ATTEMPTS):
            state, version = await self.read(route)
            decision = decide(state)
            if decision.transition is None and decision.state == state:
                return FoldResult("ok", state)
            result = await self._commit(
                route, version, decision.state, decision.transition, now, source
            )
            if result is not None:
                return result
        raise BreakerStoreError(f"route {route}: gave up after {MAX_ATTEMPTS} write conflicts")

    async def _commit(
        self,
        route: str,
        version: int,
        new_state: RouteState,
        transition: Transition | None,
        now: float,
        source: str,
    ) -> FoldResult | None:
        outbox = None
        if transition is not None:
            outbox = build_outbox(route, transition, new_state, self._signer, now, source)
            self._failpoint("before_commit")
        status, _ = await self._apply(
            self._k(route, "state"),
            version,
            orjson.dumps(new_state.to_json()),
            route,
            outbox.sealed if outbox else None,
            outbox.items() if outbox else (),
        )
        if status == "conflict":
            return None
        if outbox is not None:
            self._failpoint("after_commit")
            await self._registry.register(route, force=True)
        return FoldResult("ok", new_state, outbox)

    async def _apply(
        self,
        state_key: str,
        version: int,
        body: bytes,
        route: str,
        command: bytes | None,
        items: tuple[bytes, ...],
    ) -> tuple[str, int]:
        keys = [state_key, self.command_key(route), self._k(route, "outbox")]
        args: list[Any] = [version, body, command or b"", *items]
        with redis_errors():
            status, v = await self._script(keys=keys, args=args)
        return status_text(status), int(v)

    # -- outbox (the claim's Lua steps live in ``redis_outbox``) ---------------
    async def claim(self, route: str, owner: str, ttl_ms: int = 10_000) -> Claim | None:
        return await self._outbox.claim(route, owner, ttl_ms)

    async def ack(self, claim: Claim, count: int | None = None) -> bool:
        return await self._outbox.ack(claim, count)

    async def release(self, claim: Claim) -> None:
        await self._outbox.release(claim)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _batch_args(
    step: FoldedMany,
    version: int,
    floors: dict[str, tuple[NoiseFloorState, int]],
    outbox: Outbox | None,
) -> list[Any]:
    """``fold_batch.lua``'s arguments after the counts: the duplicates, the state's
    version and new body, the command, then per floor its version and new body (an
    empty body: unchanged). The Lua step compares each version it would write over, so a
    lost race writes nothing."""
    new_state = step.state
    args: list[Any] = [
        step.outcomes.count(None),
        version,
        orjson.dumps(new_state.to_json()) if new_state is not None else b"",
        outbox.sealed if outbox else b"",
    ]
    for mode, (_, floor_version) in floors.items():
        changed = step.floors.get(mode)
        args += [floor_version, orjson.dumps(changed.to_json()) if changed else b""]
    return args
