"""A pair the static tier settles is not kept waiting by another pair's escalation.

Real worker processes, broker and Redis. The escalation is made slow on purpose
(the ``sleep:escalate`` failpoint: ``SLEEP_S`` seconds before the full model
runs) and made certain (``sample_rate`` 1: every pair with two different texts
escalates; identical texts never do). Then:

* in one batch, the pairs that need no escalation are sent seconds before the
  escalated one, and its own route's later pair waits for it (a route's order);
* a worker killed while the escalation waits loses nothing: the waiting pairs
  were not acknowledged, so the next worker scores them, and every pair is
  judged once.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from quantdrift.demo import synthetic
from quantdrift.failpoints import SLEEP_S
from quantdrift.schemas import PairEvent
from quantdrift.schemas.record_keys import pair_record_key
from support import guard
from support.kafka import consume_n
from support.transitions import FailpointWorker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SLOW_LANE = {
    "QUANTDRIFT_EMBEDDING__TIER": "tiered",
    "QUANTDRIFT_EMBEDDING__SAMPLE_RATE": "1.0",
    # Long enough that one produce call surely lands in one batch.
    "QUANTDRIFT_WORKER__BATCH_WITHIN_S": "0.5",
}


def healthy(route: str, n: int, seed: int) -> list[PairEvent]:
    return guard.on_route(
        guard.shadow_only(synthetic.healthy(route, seed=seed), n), route, uuid.uuid4().hex[:6]
    )


def settled(pair: PairEvent) -> PairEvent:
    """The pair with the candidate's text made the reference's: it never escalates."""
    text = pair.reference.text
    return pair.model_copy(update={"candidate": pair.candidate.model_copy(update={"text": text})})


def sent_at(records: list) -> dict[str, tuple[float, int, int]]:  # type: ignore[type-arg]
    """pair id -> (the worker's send time in s, partition, offset) of its score record."""
    out = {}
    for r in records:
        score = json.loads(json.loads(r.value)["payload"])
        out[score["pair_id"]] = (r.timestamp / 1000.0, r.partition, r.offset)
    return out


async def test_a_settled_pair_is_sent_before_a_slow_escalation_in_its_batch(fault_stack) -> None:  # type: ignore[no-untyped-def]
    settings = guard.isolated_settings(fault_stack, f"qdfault:{uuid.uuid4().hex}:", partitions=1)
    await guard.make_topics(settings)
    kafka = settings.kafka
    slow_route, fast_route = "lane/slow", "lane/fast"
    slow, behind = healthy(slow_route, 2, seed=71)
    behind = settled(behind)
    fast = [settled(p) for p in healthy(fast_route, 6, seed=72)]
    worker = FailpointWorker(
        settings, fault_stack.redis_url, failpoints=("sleep:escalate",), extra_env=SLOW_LANE
    ).start()
    try:
        await guard.wait_scored(settings, worker, timeout=180)
        # One send: the pairs arrive together and share a batch; the escalated pair first.
        batch = [slow, behind, *fast]
        await guard.send_pairs(
            kafka.bootstrap_servers,
            kafka.topics.pairs,
            [(pair_record_key(p), p.dumps()) for p in batch],
        )
        records = await consume_n(
            kafka.bootstrap_servers,
            kafka.topics.scores,
            len(batch),
            timeout=90,
            predicate=lambda r: r.key in (slow_route.encode(), fast_route.encode()),
        )
        at = sent_at(records)
        assert set(at) == {p.pair_id for p in batch}
        slow_t = at[slow.pair_id][0]
        fast_last = max(at[p.pair_id][0] for p in fast)
        assert fast_last < slow_t - SLEEP_S / 2, (
            f"the settled pairs were sent {slow_t - fast_last:.2f} s before the escalated one: "
            "they waited for its escalation"
        )
        # The escalated pair's own route keeps its order: the pair behind it waited.
        assert at[behind.pair_id][1] == at[slow.pair_id][1]
        assert at[behind.pair_id][2] > at[slow.pair_id][2]
        tiers = {
            json.loads(json.loads(r.value)["payload"])["pair_id"]: json.loads(
                json.loads(r.value)["payload"]
            )["metrics"]["cosine_tier"]
            for r in records
        }
        assert tiers[slow.pair_id] == "minilm"
        assert {tiers[p.pair_id] for p in [behind, *fast]} == {"static"}
        await guard.until_seen(settings, slow_route, 2, worker, timeout=60)
        await guard.until_seen(settings, fast_route, len(fast), worker, timeout=60)
        assert "sleep:escalate: sleeping" in worker.stderr()
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()


async def test_a_worker_killed_while_an_escalation_waits_loses_no_pair(fault_stack) -> None:  # type: ignore[no-untyped-def]
    settings = guard.isolated_settings(fault_stack, f"qdfault:{uuid.uuid4().hex}:", partitions=1)
    await guard.make_topics(settings)
    kafka = settings.kafka
    slow_route, fast_route = "lanekill/slow", "lanekill/fast"
    slow, behind = healthy(slow_route, 2, seed=73)
    behind = settled(behind)
    fast = [settled(p) for p in healthy(fast_route, 6, seed=74)]
    first = FailpointWorker(
        settings, fault_stack.redis_url, failpoints=("sleep:escalate",), extra_env=SLOW_LANE
    ).start()
    second: FailpointWorker | None = None
    try:
        await guard.wait_scored(settings, first, timeout=180)
        batch = [slow, behind, *fast]
        await guard.send_pairs(
            kafka.bootstrap_servers,
            kafka.topics.pairs,
            [(pair_record_key(p), p.dumps()) for p in batch],
        )
        # The settled pairs are judged while the escalation sleeps; a commit interval
        # (0.5 s) later the worker has committed every offset it acknowledged.
        await guard.until_seen(settings, fast_route, len(fast), first, timeout=60)
        await asyncio.sleep(1.0)
        prefix = settings.redis.key_prefix
        waiting = await guard.route_state(fault_stack.redis_url, prefix, slow_route)
        assert first.kill_9() == -9
        assert waiting.pairs_seen == 0, "the escalation finished before the kill: no test"
        # The same group, a worker without the failpoint: the two waiting pairs come back.
        second = FailpointWorker(settings, fault_stack.redis_url, extra_env=SLOW_LANE).start()
        await guard.until_seen(settings, slow_route, 2, second, timeout=120)
        await asyncio.sleep(1.5)  # a pair judged twice would land now
        assert (await guard.route_state(fault_stack.redis_url, prefix, slow_route)).pairs_seen == 2
        assert (
            await guard.route_state(fault_stack.redis_url, prefix, fast_route)
        ).pairs_seen == len(fast)
    finally:
        first.kill()
        if second is not None:
            second.stop()
