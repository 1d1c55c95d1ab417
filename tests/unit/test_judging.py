"""The judge agent's step on the in-memory store: no broker, no Redis.

The agent reads records, calls ``judge_records`` and flushes the routes it names
through the outbox relay; these drive exactly that, on ``MemoryBreakerStore``.
"""

from __future__ import annotations

import json

from quantdrift.breaker import MemoryBreakerStore, OutboxRelay, Policy, RoutePolicy
from quantdrift.breaker.outbox import OutboxItem
from quantdrift.schemas import CommandSigner, CommandVerifier, Metrics, ScoreEvent
from quantdrift.streams.handlers import RawRecord, parse_batch
from quantdrift.streams.judging import judge_records

KEY = b"judging-test-key-of-at-least-32-bytes"
SIGNER = CommandSigner("k1", KEY)
NOW = 1_700_000_000.0
ROUTE = "cs-agent/int4"
# Three failing pairs in a row open the route once five have been seen.
POLICY = Policy(default=RoutePolicy(rules=("consecutive",), min_pairs=5, consecutive_failures=3))


def score(i: int, failing: bool = False) -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"p{i}",
        route=ROUTE,
        kind="shadow",
        ts=NOW,
        decoding="greedy",
        metrics=Metrics(cosine=0.4 if failing else 0.97),
        verdict="drift" if failing else "ok",
        reasons=["cosine 0.40 < 0.88"] if failing else [],
    )


def record(value: bytes, offset: int, key: bytes = ROUTE.encode()) -> RawRecord:
    return RawRecord(value, key, "quantdrift.scores.v1", 0, offset)


def signed(scores: list[ScoreEvent]) -> list[RawRecord]:
    return [record(SIGNER.seal_score(s, NOW), i) for i, s in enumerate(scores)]


async def judge(store: MemoryBreakerStore, records: list[RawRecord]):  # type: ignore[no-untyped-def]
    verifier = CommandVerifier({"k1": KEY})
    return await judge_records(records, store, POLICY, verifier, lambda: NOW, 3600.0)


async def test_a_score_batch_folds_into_the_route() -> None:
    store = MemoryBreakerStore(SIGNER)
    judged = await judge(store, signed([score(i) for i in range(4)]))
    assert judged.dead == () and [r.status for r in judged.results] == ["ok"] * 4
    assert judged.duplicates == 0 and judged.outboxes == [] and judged.routes == []
    state, _ = await store.read(ROUTE)
    assert (state.state, state.pairs_seen) == ("closed", 4)


async def test_a_transition_yields_one_command_and_one_alert() -> None:
    store = MemoryBreakerStore(SIGNER)
    judged = await judge(store, signed([score(i, failing=i >= 3) for i in range(8)]))
    (outbox,) = judged.outboxes
    assert (outbox.transition.from_state, outbox.transition.to_state) == ("closed", "open")
    assert judged.routes == [ROUTE]
    sent: list[OutboxItem] = []

    async def send(item: OutboxItem) -> None:
        sent.append(item)

    relay = OutboxRelay(store, send, owner="test")
    assert await relay.flush(ROUTE) == 2
    assert [item.topic for item in sent] == ["control", "alerts"]
    command = CommandVerifier({"k1": KEY}).open(sent[0].value)  # signed, as gateways check
    assert (command.route, command.action, command.target) == (ROUTE, "rollback", "reference")
    assert json.loads(sent[1].value)["kind"] == "breaker.open"
    assert await relay.flush(ROUTE) == 0  # sent once: the outbox is empty now


async def test_a_redelivered_batch_folds_nothing() -> None:
    store = MemoryBreakerStore(SIGNER)
    records = signed([score(i, failing=i >= 3) for i in range(8)])
    first = await judge(store, records)
    before = await store.read(ROUTE)
    again = await judge(store, records)
    assert [r.status for r in again.results] == ["dup"] * 8 and again.duplicates == 8
    assert again.outboxes == [] and again.routes == []
    assert await store.read(ROUTE) == before and len(first.outboxes) == 1
    assert await store.duplicates(ROUTE) == 8


async def test_bad_bytes_go_to_the_dlq_with_the_reason_and_fold_nothing() -> None:
    store = MemoryBreakerStore(SIGNER)
    bare = score(1).dumps()  # a score no worker signed: anyone could have written it
    forged = CommandSigner("k1", b"x" * 32).seal_score(score(2), NOW)
    judged = await judge(store, [record(b"{oops", 0), record(bare, 1), record(forged, 2)])
    assert judged.scores == () and judged.results == ()
    assert [d.offset for d in judged.dead] == [0, 1, 2]
    assert judged.dead[0].original() == b"{oops" and "not a signed score" in judged.dead[0].error
    assert "not in a SignedScore envelope" in judged.dead[1].error
    assert "signature" in judged.dead[2].error
    assert await store.routes() == []
    # The score agent's side: a pair that does not parse is a dead letter, with the reason.
    pairs, dead = parse_batch([RawRecord(b"\xff", b"r", "quantdrift.pairs.v1", 0, 7)], NOW)
    assert pairs == [] and dead[0].offset == 7 and dead[0].error


async def test_a_floorless_test_is_logged_once_and_the_not_armed_alert_is_flushed(
    caplog,  # type: ignore[no-untyped-def]
) -> None:
    """The default rule on a route with no floor: each relied-on divergence test is
    logged once (not per pair, not per batch), and after ``unarmed_alert_pairs`` the
    one P2 alert is queued, named in ``routes`` so the agent flushes it."""
    store = MemoryBreakerStore(SIGNER)
    policy = Policy(default=RoutePolicy(min_pairs=5, unarmed_alert_pairs=12))
    verifier = CommandVerifier({"k1": KEY})
    routes: list[list[str]] = []
    caplog.set_level("WARNING", logger="quantdrift.worker")
    for batch in range(4):
        records = signed([score(i) for i in range(batch * 5, batch * 5 + 5)])
        judged = await judge_records(records, store, policy, verifier, lambda: NOW, 3600.0)
        routes.append(judged.routes)
    notices = [r.getMessage() for r in caplog.records if "abstains on every pair" in r.getMessage()]
    assert len(notices) == 1 and "tolerance:dissimilarity: no blessing" in notices[0]
    assert routes == [[], [], [ROUTE], []]  # the 12th pair is in the third batch
    sent: list[OutboxItem] = []

    async def send(item: OutboxItem) -> None:
        sent.append(item)

    assert await OutboxRelay(store, send, owner="test").flush(ROUTE) == 1
    alert = json.loads(sent[0].value)
    assert (alert["kind"], alert["severity"]) == ("breaker.not_armed", "P2")
    assert "tolerance:dissimilarity: no blessing: 0 greedy noise pairs" in alert["summary"]
