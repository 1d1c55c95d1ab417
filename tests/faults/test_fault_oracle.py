"""The fault schedule's checker catches what it is there to catch.

The checker (``support/fault_oracle.py``) is every fault case's oracle, so it must be
able to fail. Here it reads a run planted on the real broker and Redis with one breach
of each property: a pair never judged, a pair folded twice, two commands for one
epoch, a decisive pair behind two transitions, a user's 503, the candidate served
after a lock. The records are written by hand on purpose: the point is what the
checker says about bytes no part of quantdrift would write. The same run without the
breaches passes. A third run restarts a broker empty between its two halves and is
audited through the topic tap.
"""

from __future__ import annotations

import asyncio
import uuid

import orjson
import pytest
import redis

from quantdrift.stack import EmbeddedStack, TansuBroker, free_port
from quantdrift.stack.broker import create_topics
from support.fault_oracle import Run, check
from support.guard import wait_until
from support.kafka import produce, unique_topic
from support.topic_tap import TopicTap

pytestmark = [pytest.mark.timeout(120)]

ROUTE = "oracle/int4"


def planted(stack: EmbeddedStack, breaches: bool) -> Run:
    prefix = f"qdoracle:{uuid.uuid4().hex}:"
    topics = {name: unique_topic(name) for name in ("pairs", "scores", "dlq", "control")}
    ids = [f"p{i}" for i in range(6)]
    pairs = [orjson.dumps({"pair_id": p, "route": ROUTE, "kind": "shadow"}) for p in ids]
    judged = ids[:-1] if breaches else ids  # breach: the last pair never judged

    def command(cid: str, epoch: int, decisive: str, action: str = "rollback") -> bytes:
        body = {"command_id": cid, "route": ROUTE, "action": action, "epoch": epoch}
        body["evidence"] = {"decisive_pair_id": decisive}
        return orjson.dumps(
            {"key_id": "k", "signature": "s", "payload": orjson.dumps(body).decode()}
        )

    commands = [command("c1", 10, "p2"), command("c2", 20, "p3", "canary")]
    if breaches:
        commands += [command("c3", 20, "p2")]  # same epoch, same decisive pair
    scores = [
        orjson.dumps({"payload": orjson.dumps({"pair_id": p, "route": ROUTE}).decode()})
        for p in judged
    ]

    async def write() -> None:
        await produce(stack.bootstrap, topics["pairs"], [(None, v) for v in pairs])
        await produce(stack.bootstrap, topics["scores"], [(None, v) for v in scores])
        await produce(stack.bootstrap, topics["control"], [(ROUTE.encode(), v) for v in commands])
        await produce(stack.bootstrap, topics["dlq"], [(None, b"{}")])

    asyncio.run(write())
    client = redis.Redis.from_url(stack.redis_url)
    for p in judged:
        client.set(f"{prefix}route:{{{ROUTE}}}:seen:shadow:{p}", "1", ex=600)
    state = {"pairs_seen": len(judged) + (1 if breaches else 0), "trips": 1, "epoch": 20}
    client.hset(f"{prefix}route:{{{ROUTE}}}:state", "s", orjson.dumps(state))
    client.close()
    answers = [(float(t), 200, "int4") for t in range(10)] + [(12.0, 200, "bf16")]
    if breaches:
        answers += [(13.0, 503, ""), (14.0, 200, "int4")]
    return Run(stack.bootstrap, topics, stack.redis_url, prefix, ROUTE, [], answers, locked_at=10.0)


def test_the_checker_names_each_breach(fault_stack: EmbeddedStack) -> None:
    audit = check(planted(fault_stack, breaches=True))
    found = "\n".join(audit.violations)
    assert "1 pairs neither judged nor dead-lettered: ['p5']" in found
    assert "pairs_seen 6 != 5 distinct shadow pairs judged" in found
    assert "two commands for one epoch: [20]" in found
    assert "one decisive pair moved the route twice: ['p2']" in found
    assert "state says 1 trips, the topic 2" in found
    assert "users saw {503: 1}" in found
    assert "candidate served [4.0] s after the lock" in found
    assert len(audit.violations) == 7, found


def test_the_checker_passes_a_clean_run(fault_stack: EmbeddedStack) -> None:
    audit = check(planted(fault_stack, breaches=False))
    assert audit.violations == []
    assert (audit.pairs_on_topic, audit.judged, audit.commands) == (6, 6, 2)


def test_a_broker_that_forgot_its_topics_is_audited_through_the_tap(
    fault_stack: EmbeddedStack,
) -> None:
    """A broker restarted empty: what the tap kept of its first life is audited with
    the second. A pair of the dead broker's left unjudged is lost with it (counted,
    allowed); one on the new broker left unjudged is a breach."""
    port = free_port()
    broker = TansuBroker(port=port).start()
    topics = {name: unique_topic(name) for name in ("pairs", "scores", "dlq", "control")}
    asyncio.run(create_topics(broker.bootstrap, topics.values(), 2))
    tap = TopicTap(broker.bootstrap, list(topics.values())).start()
    prefix = f"qdoracle:{uuid.uuid4().hex}:"

    def pairs(ids: list[str]) -> list[tuple[bytes | None, bytes]]:
        return [(None, orjson.dumps({"pair_id": p, "route": ROUTE, "kind": "shadow"})) for p in ids]

    try:
        asyncio.run(produce(broker.bootstrap, topics["pairs"], pairs(["a0", "a1", "a2"])))
        wait_until(lambda: tap.count(topics["pairs"], 0) == 3, 30, "the tap reading life 0")
        broker.stop()
        tap.restarted()
        broker = TansuBroker(port=port).start()
        asyncio.run(create_topics(broker.bootstrap, topics.values(), 2))
        tap.wait_reading()
        asyncio.run(produce(broker.bootstrap, topics["pairs"], pairs(["b0", "b1"])))
        client = redis.Redis.from_url(fault_stack.redis_url)
        for p in ("a0", "a1", "b0"):  # a2 lost with the dead broker; b1 a breach
            client.set(f"{prefix}route:{{{ROUTE}}}:seen:shadow:{p}", "1", ex=600)
        client.hset(f"{prefix}route:{{{ROUTE}}}:state", "s", orjson.dumps({"pairs_seen": 3}))
        client.close()
        run = Run(broker.bootstrap, topics, fault_stack.redis_url, prefix, ROUTE, [], [])
        run.tap, run.sent_at_loss = tap, 3.0
        audit = check(run)
    finally:
        tap.stop()
        broker.stop()
    assert audit.violations == ["1 pairs neither judged nor dead-lettered: ['b1']"]
    assert (audit.pairs_on_topic, audit.judged, audit.lost_read) == (5, 3, 1)
