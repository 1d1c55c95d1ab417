"""A forged ScoreEvent on the scores topic moves no route; the worker's own scores still do.

Real broker, real Redis, a real ``quantdrift worker`` process. The attacker can write
to Kafka but holds no signing key: bare ScoreEvents (what any producer could write
before scores were signed), envelopes signed with a guessed key or an unknown key id,
a genuine envelope with its verdict flipped, and a route of 100 kB. Each one is
dead-lettered with its reason; the route stays closed with no pair counted. Then
drifted pairs go through the front door (the pairs topic) and the same route rolls
back: the check can fail.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from quantdrift.demo import synthetic
from quantdrift.schemas import CommandSigner, DeadLetter, Metrics, ScoreEvent
from support import guard
from support.kafka import consume_n

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FORGED_PER_KIND = 30  # more than min_pairs (20): folded, these would trip the breaker


def forged_score(route: str, i: int) -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"forged-{uuid.uuid4().hex}-{i}",
        route=route,
        kind="shadow",
        ts=time.time(),
        metrics=Metrics(cosine=0.05, rougeL=0.01, looping=True),
        verdict="drift",
        reasons=["forged"],
        scored_at=time.time(),
    )


def flipped(envelope: bytes) -> bytes:
    """A genuine signed score with its verdict changed: the MAC no longer matches."""
    data = json.loads(envelope)
    payload = json.loads(data["payload"])
    payload["verdict"] = "drift"
    data["payload"] = json.dumps(payload)
    return json.dumps(data).encode()


async def test_forged_scores_move_no_route_and_genuine_ones_still_do(fault_worker) -> None:  # type: ignore[no-untyped-def]
    cfg, worker = fault_worker
    kafka = cfg.kafka
    assert cfg.redis.url is not None
    route = f"forge/{uuid.uuid4().hex[:6]}"
    key = route.encode()
    guessed = CommandSigner(cfg.signing.active_key_id, b"g" * 32)
    stranger = CommandSigner("attacker", b"a" * 32)
    n = FORGED_PER_KIND
    forged: list[bytes] = []
    forged += [forged_score(route, i).dumps() for i in range(n)]
    forged += [guessed.seal_score(forged_score(route, i), time.time()) for i in range(n)]
    forged += [stranger.seal_score(forged_score(route, i), time.time()) for i in range(n)]
    # The one way to a genuine envelope without the key: copy one off the topic, then edit.
    warm = await consume_n(kafka.bootstrap_servers, kafka.topics.scores, 1, timeout=20)
    forged += [flipped(warm[0].value)]
    huge = forged_score(route, 0).model_dump(mode="json")
    huge["route"] = "r" * 100_000
    forged += [json.dumps(huge).encode()]
    await guard.send_pairs(kafka.bootstrap_servers, kafka.topics.scores, [(key, f) for f in forged])

    # Every forged record reaches the DLQ with its reason: the judge read them all.
    letters = [
        DeadLetter.parse(r.value)
        for r in await consume_n(
            kafka.bootstrap_servers,
            kafka.topics.dlq,
            len(forged),
            timeout=60,
            predicate=lambda r: r.key == key,
        )
    ]
    assert sorted(x.original() for x in letters) == sorted(forged)
    assert all(x.topic == kafka.topics.scores and x.offset is not None for x in letters)
    reasons = [x.error for x in letters]
    assert sum("bare ScoreEvent" in e for e in reasons) == n
    assert sum("route: String should have at most 200 characters" in e for e in reasons) == 1
    assert sum("unknown key id 'attacker'" in e for e in reasons) == n
    assert sum("does not match the payload" in e for e in reasons) == n + 1
    state = await guard.route_state(cfg.redis.url, cfg.redis.key_prefix, route)
    assert (state.state, state.pairs_seen, state.trips) == ("closed", 0, 0), state
    control = await guard.records_for(kafka.bootstrap_servers, kafka.topics.control, route)
    assert guard.commands_on(control) == []

    # The front door still works, on the same route: the worker scores, signs, judges.
    drifted = guard.on_route(
        guard.shadow_only(synthetic.drifted(route, seed=31), 25), route, "real"
    )
    await guard.send_pairs(
        kafka.bootstrap_servers, kafka.topics.pairs, [(key, p.dumps()) for p in drifted]
    )
    state = await guard.until_seen(cfg, route, len(drifted), worker, timeout=60)
    assert (state.state, state.trips) == ("open", 1), state
    commands = await consume_n(
        kafka.bootstrap_servers,
        kafka.topics.control,
        1,
        timeout=20,
        predicate=lambda r: r.key == key,
    )
    assert guard.commands_on(commands) == [("rollback", state.epoch)]
    assert worker.alive(), worker.log_tail()
