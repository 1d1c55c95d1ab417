"""The end-of-run checker of the fault rig: every pair and every command accounted for.

Written apart from the code it checks: it imports nothing of quantdrift's breaker,
worker or gateway. It reads what a run left behind as an outside auditor would, in
the wire formats the docs define (docs/messages.md, ``schemas/keys.py``'s layout):

* the topics, from the start to their end offsets: pairs, scores, dead letters and
  commands (the command's JSON inside its signed envelope);
* Redis: each route's state hash (``s``) and its ``seen:KIND:ID`` dedupe keys, one
  per pair the judge folded;
* each gateway's ``/metrics`` counters and ``/health``;
* what the users saw (the SDK load's (time, status, precision) answers).

When the run restarted the broker, whose storage is memory, the topics are what a
tap (``topic_tap.py``) kept of both of the broker's lives plus a last read of the
live one; what the dead broker held and no one judged is accounted for as lost with
it, by life, and bounded by the gateways' acknowledged sends at its death.

And proves, returning every breach as one line (``Audit.violations``):

1. every mirrored request is a pair on the topic, or a drop the gateway counted
   with its stage (queue, publish, error); every pair on the topic was judged into
   the route's state exactly once (its ``seen`` key exists, and the state's
   ``pairs_seen`` equals the number of distinct shadow pairs judged) or was
   dead-lettered with a reason. After a Redis that lost its state, a pair judged
   before the loss is accounted for by its score on the scores topic. A send the
   broker did not acknowledge is counted dropped, yet may have landed: the topic
   holds between the acknowledged sends and those plus the unacknowledged ones.
   After a broker restart that lost its storage: every pair the new broker holds was
   judged or dead-lettered, and it holds every pair acknowledged after the death; a
   pair on the old broker left unjudged is lost with it, and so is one it acknowledged
   that no one read (at most the sends acknowledged before its death);
2. no route changed state twice for one decision: distinct commands have distinct
   epochs, epochs only grow, no decisive pair decided two transitions, and the
   state's ``trips`` equals the breaker's rollbacks on the topic;
3. every gateway that can reach a control source applied the newest command;
4. no user request got a 5xx or a connection error (the cases fault the control
   and data planes, never the user's path);
5. after a lock, no user was served the candidate once the gateways had had their
   bound to apply it.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
from aiokafka import AIOKafkaConsumer, TopicPartition

from support.gateway_process import GatewayProcess
from support.topic_tap import TopicTap

Answer = tuple[float, int, str]  # (monotonic time, HTTP status or 0/-1, precision served)


@dataclass
class Audit:
    """What the checker found: the numbers of the fault table and every breach."""

    pairs_on_topic: int = 0
    judged: int = 0
    judged_before_loss: int = 0
    dead_lettered: int = 0
    dropped: dict[str, float] = field(default_factory=dict)
    mirrored: float = 0.0
    topic_duplicates: int = 0
    landed_unacked: int = 0  # counted dropped at publish, found on the topic (and judged)
    lost_read: int = 0  # on the broker that died, read by the tap, never judged
    lost_unread: int = 0  # acknowledged by the broker that died, read by no one
    scores_duplicates: int = 0
    commands: int = 0
    republished: int = 0
    requests: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def accounted(self) -> str:
        """One cell of the fault table: mirrored = judged + dead-lettered + dropped."""
        drops = "+".join(f"{v:.0f} {k}" for k, v in sorted(self.dropped.items()) if v)
        before = f" (+{self.judged_before_loss} before the loss)" if self.judged_before_loss else ""
        landed = (
            f" ({self.landed_unacked} of them unacknowledged yet on the topic, judged)"
            if self.landed_unacked
            else ""
        )
        lost = (
            f", lost with the broker {self.lost_read} read + {self.lost_unread} unread"
            if self.lost_read or self.lost_unread
            else ""
        )
        return (
            f"{self.mirrored:.0f} mirrored: {self.judged} judged{before}, "
            f"{self.dead_lettered} dead-lettered, dropped {drops or '0'}{lost}{landed}"
        )


# -- reading ------------------------------------------------------------------------------


async def _read_topic(bootstrap: str, topic: str, timeout: float) -> list[Any]:
    """Every record of ``topic`` up to its end offsets at the time of the call."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not parts:
            await consumer.force_metadata_update()
            parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: could not read to its end within {timeout}s")
            for records in (await consumer.getmany(timeout_ms=300)).values():
                got.extend(records)
        return got
    finally:
        await consumer.stop()


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list[Any]:
    return asyncio.run(_read_topic(bootstrap, topic, timeout))


def _json(raw: bytes | str | None) -> dict[str, Any] | None:
    try:
        data = orjson.loads(raw or b"")
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _payload(raw: bytes | None) -> dict[str, Any] | None:
    """The message inside a signed envelope (commands, scores), or the record itself."""
    data = _json(raw)
    if data is not None and isinstance(data.get("payload"), str):
        return _json(data["payload"])
    return data


def judged_ids(client: redis.Redis, prefix: str, route: str) -> dict[str, set[str]]:
    """The pair ids the judge marked seen, by kind (``shadow``, ``noise``)."""
    head = f"{prefix}route:{{{route}}}:seen:"
    out: dict[str, set[str]] = {}
    for key in client.scan_iter(match=head.replace("[", "\\[") + "*", count=1000):
        kind, _, pair_id = key.decode()[len(head) :].partition(":")
        out.setdefault(kind, set()).add(pair_id)
    return out


def route_state(client: redis.Redis, prefix: str, route: str) -> dict[str, Any]:
    raw = client.hget(f"{prefix}route:{{{route}}}:state", "s")
    return _json(raw) or {}


# -- the checks ---------------------------------------------------------------------------


@dataclass
class Run:
    """What the checker is told about a run: where to read, and what happened when."""

    bootstrap: str
    topics: dict[str, str]  # pairs, scores, dlq, control
    redis_url: str
    prefix: str
    route: str
    gateways: list[GatewayProcess]
    answers: list[Answer]
    errors: list[Answer] = field(default_factory=list)  # (time, status, what it said)
    locked_at: float | None = None  # monotonic time the lock was issued
    apply_bound_s: float = 2.0
    state_lost: bool = False  # Redis lost its data during the run
    tap: TopicTap | None = None  # the topics as a tap kept them (the broker may forget)
    sent_at_loss: float | None = None  # the gateways' acknowledged sends when the broker died


def _read(run: Run, topic: str) -> list[Any]:
    """Every record of ``topic``: the live broker to its end, plus what the tap kept."""
    now = read_topic(run.bootstrap, topic)
    return run.tap.merged(topic, now) if run.tap is not None else now


def check(run: Run) -> Audit:
    """Read everything and prove the five properties; ``Audit.violations`` lists breaches."""
    audit = Audit()
    client = redis.Redis.from_url(run.redis_url, socket_timeout=10)
    try:
        seen = judged_ids(client, run.prefix, run.route)
        state = route_state(client, run.prefix, run.route)
    finally:
        client.close()
    _pairs(run, audit, seen, state)
    newest = _commands(run, audit, state)
    _gateways(run, audit, newest)
    _users(run, audit)
    return audit


def _pairs(run: Run, audit: Audit, seen: dict[str, set[str]], state: dict[str, Any]) -> None:
    """Property 1: mirrored = on the topic + counted drops; on the topic = judged once
    (or before a state loss) + dead-lettered."""
    by_kind: dict[str, list[str]] = {}
    life: dict[str, int] = {}  # pair id -> the broker's life it was found in
    for record in _read(run, run.topics["pairs"]):
        pair = _json(record.value)
        if pair is None or pair.get("route") != run.route:
            continue
        by_kind.setdefault(str(pair.get("kind")), []).append(str(pair.get("pair_id")))
        life.setdefault(str(pair.get("pair_id")), getattr(record, "generation", 0))
    ids = {kind: set(v) for kind, v in by_kind.items()}
    on_topic = set().union(*ids.values()) if ids else set()
    audit.pairs_on_topic = len(on_topic)
    audit.topic_duplicates = sum(len(v) - len(set(v)) for v in by_kind.values())

    dead = _dead_lettered(run)
    audit.dead_lettered = len(dead & on_topic)
    scored = Counter(
        str(s.get("pair_id"))
        for r in _read(run, run.topics["scores"])
        if (s := _payload(r.value)) is not None and s.get("route") == run.route
    )
    audit.scores_duplicates = sum(n - 1 for n in scored.values() if n > 1)
    judged = set().union(*seen.values()) if seen else set()
    audit.judged = len(judged & on_topic)
    strangers = judged - on_topic
    last = run.tap.generation if run.tap is not None else 0
    if strangers and run.sent_at_loss is not None:
        # The worker read them from the broker that died before the tap did.
        on_topic |= strangers
        life.update(dict.fromkeys(strangers, 0))
        audit.judged = len(judged & on_topic)
        strangers = set()
    if strangers:
        audit.violations.append(f"{len(strangers)} pairs judged that are not on the topic")
    missing = on_topic - judged - dead
    if run.sent_at_loss is not None:
        lost = {p for p in missing if life.get(p, last) < last}
        audit.lost_read = len(lost)
        missing -= lost
    if run.state_lost:
        before = {p for p in missing if scored[p] > 0}
        audit.judged_before_loss = len(before)
        missing -= before
    if missing:
        sample = sorted(missing)[:3]
        audit.violations.append(f"{len(missing)} pairs neither judged nor dead-lettered: {sample}")
    shadow_judged = len(seen.get("shadow", set()))
    if state and int(state.get("pairs_seen", 0)) != shadow_judged:
        audit.violations.append(
            f"pairs_seen {state.get('pairs_seen')} != {shadow_judged} distinct shadow pairs "
            "judged: a pair was folded twice (or lost)"
        )
    old = sum(1 for p in on_topic if life.get(p, last) < last)
    _gateway_pairs(run, audit, len(on_topic), old)


def _dead_lettered(run: Run) -> set[str]:
    """The pair ids of the dead letters that carry a reason (a letter without one breaches)."""
    out = set()
    for record in _read(run, run.topics["dlq"]):
        letter = _json(record.value) or {}
        original = _json(base64.b64decode(letter.get("original_b64") or b""))
        if original is not None and original.get("route") == run.route:
            out.add(str(original.get("pair_id")))
    return out


def _gateway_pairs(run: Run, audit: Audit, on_topic: int, old: int = 0) -> None:
    """``old`` of the ``on_topic`` pairs were on a broker that died and forgot them."""
    sent = 0.0
    for gw in run.gateways:
        m = gw.metric
        sampled = m("quantdrift_gateway_shadow_sampled_total")
        offered = m("quantdrift_gateway_pairs_offered_total")
        drops = {
            "queue": m("quantdrift_gateway_shadow_dropped_total", stage="queue"),
            "publish": m("quantdrift_gateway_shadow_dropped_total", stage="publish"),
            "error": m("quantdrift_gateway_shadow_errors_total"),
        }
        sent += m("quantdrift_gateway_pairs_sent_total")
        audit.mirrored += sampled
        for k, v in drops.items():
            audit.dropped[k] = audit.dropped.get(k, 0.0) + v
        if sampled != offered + drops["queue"] + drops["error"]:
            audit.violations.append(f"{gw.host}: sampled {sampled} != offered {offered} + {drops}")
        if offered != m("quantdrift_gateway_pairs_sent_total") + drops["publish"]:
            audit.violations.append(f"{gw.host}: offered {offered} != sent + dropped {drops}")
    unacked = audit.dropped.get("publish", 0.0)
    if run.gateways and run.sent_at_loss is not None:
        # What the new broker holds: every send acknowledged after the death. The old
        # one held at most what it acknowledged; the rest of that, no one read.
        after, new = sent - run.sent_at_loss, on_topic - old
        if not after <= new <= after + unacked:
            audit.violations.append(
                f"the gateways sent {after:.0f} pairs after the broker's death (and "
                f"{unacked:.0f} unacknowledged), the new broker holds {new}"
            )
        if old > run.sent_at_loss + unacked:
            audit.violations.append(
                f"the dead broker held {old} pairs, more than the {run.sent_at_loss:.0f} "
                f"acknowledged (and {unacked:.0f} unacknowledged) before its death"
            )
        audit.lost_unread = max(0, int(run.sent_at_loss) - old)
        on_topic += audit.lost_unread
    # A send the broker never acknowledged is counted dropped (stage=publish), yet under a
    # partition its request may have landed: the topic then holds it, judged like any
    # other. So the topic holds at least what was acknowledged, at most that plus those.
    audit.landed_unacked = int(on_topic - sent)
    if run.gateways and not sent <= on_topic <= sent + unacked:
        audit.violations.append(
            f"the gateways sent {sent:.0f} pairs (and {audit.dropped.get('publish', 0):.0f} "
            f"unacknowledged), the topic holds {on_topic}"
        )


def _commands(run: Run, audit: Audit, state: dict[str, Any]) -> int:
    """Property 2; returns the newest epoch on the topic."""
    commands = [
        c
        for r in _read(run, run.topics["control"])
        if (c := _payload(r.value)) is not None and c.get("route") == run.route
    ]
    distinct: dict[str, dict[str, Any]] = {}
    for c in commands:
        distinct.setdefault(str(c["command_id"]), c)
    audit.commands = len(distinct)
    audit.republished = len(commands) - len(distinct)
    epochs = [int(c["epoch"]) for c in distinct.values()]
    doubled = [e for e, n in Counter(epochs).items() if n > 1]
    if doubled:
        audit.violations.append(f"two commands for one epoch: {doubled}")
    if epochs != sorted(epochs):
        audit.violations.append(f"epochs went backwards on the topic: {epochs}")
    decisive = Counter(
        c["evidence"]["decisive_pair_id"]
        for c in distinct.values()
        if isinstance(c.get("evidence"), dict) and c["evidence"].get("decisive_pair_id")
    )
    twice = [p for p, n in decisive.items() if n > 1]
    if twice:
        audit.violations.append(f"one decisive pair moved the route twice: {twice}")
    trips = sum(
        1
        for c in distinct.values()
        if c.get("action") == "rollback" and c.get("source", "breaker") == "breaker"
    )
    if state and not run.state_lost and int(state.get("trips", 0)) != trips:
        audit.violations.append(f"state says {state.get('trips')} trips, the topic {trips}")
    return max(epochs, default=0)


def _gateways(run: Run, audit: Audit, newest: int) -> None:
    """Property 3: each gateway holds the newest epoch (its control sources are back)."""
    for gw in run.gateways:
        applied = gw.health()["routes"][run.route]["epoch"]
        if applied != newest:
            audit.violations.append(f"{gw.host} applied epoch {applied}, the newest is {newest}")


def _users(run: Run, audit: Audit) -> None:
    """Properties 4 and 5."""
    audit.requests = len(run.answers)
    bad = Counter(status for _, status, _ in run.answers if status != 200)
    if bad:
        said = [f"{m} (+{t - run.answers[0][0]:.1f}s)" for t, _, m in run.errors[:3]]
        audit.violations.append(f"users saw {dict(bad)} (0: connection error): {said}")
    if run.locked_at is not None:
        after = run.locked_at + run.apply_bound_s
        served = [t - run.locked_at for t, s, p in run.answers if s == 200 and t >= after]
        leaked = [
            round(t - run.locked_at, 2)
            for t, s, p in run.answers
            if s == 200 and t >= after and p != "bf16"
        ]
        if leaked:
            audit.violations.append(f"candidate served {leaked[:5]} s after the lock")
        if not served:
            audit.violations.append("no answer after the lock's bound: the lock went untested")
