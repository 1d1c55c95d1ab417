"""A failure inside an agent never acknowledges pairs that were not scored.

Faust's ``take_events`` acknowledges a batch in a ``finally``: before, an exception
leaving the score agent committed the offsets of pairs never scored (lost), and a
scoring exception sent the whole batch to the DLQ. Now:

* a pair whose scoring raises is dead-lettered alone, with the reason; its
  neighbours in the batch are scored and judged;
* any other failure inside a batch exits the worker (code 70) before the ack; the
  next worker in the group reads the same pairs again and judges each once.

Real worker processes, broker and Redis; the exception is injected at a named
failpoint (``raise:...``), the one way to make a real worker raise at that line.
"""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest

from quantdrift.demo import synthetic
from quantdrift.schemas import DeadLetter, PairEvent
from support import guard
from support.kafka import consume_n
from support.transitions import FailpointWorker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def healthy(route: str, n: int, seed: int) -> list[PairEvent]:
    return guard.on_route(
        guard.shadow_only(synthetic.healthy(route, seed=seed), n), route, uuid.uuid4().hex[:6]
    )


async def test_a_pair_whose_scoring_raises_is_dead_lettered_alone(fault_stack) -> None:  # type: ignore[no-untyped-def]
    settings = guard.isolated_settings(fault_stack, f"qdfault:{uuid.uuid4().hex}:", partitions=2)
    await guard.make_topics(settings)
    kafka = settings.kafka
    route = "agent/poison"
    pairs = healthy(route, 12, seed=61)
    poison = pairs[5]
    worker = FailpointWorker(
        settings, fault_stack.redis_url, failpoints=(f"raise:score:{poison.pair_id}",)
    ).start()
    try:
        await guard.wait_scored(settings, worker)
        # One send: the pairs arrive together, so the poison shares a batch with others.
        await guard.send_pairs(
            kafka.bootstrap_servers,
            kafka.topics.pairs,
            [(route.encode(), p.dumps()) for p in pairs],
        )
        letters = await consume_n(
            kafka.bootstrap_servers,
            kafka.topics.dlq,
            1,
            timeout=60,
            predicate=lambda r: r.key == route.encode(),
        )
        letter = DeadLetter.parse(letters[0].value)
        assert PairEvent.parse(letter.original()).pair_id == poison.pair_id
        assert letter.error.startswith("scoring failed: InjectedFault"), letter.error
        assert f"raise:score:{poison.pair_id}" in worker.stderr()  # the fault really fired
        # ... inside a batch with neighbours, which were then scored one by one
        shared = re.search(r"batch of (\d+) pairs; scoring each alone", worker.log_tail(50_000))
        assert shared and int(shared.group(1)) > 1, worker.log_tail()
        await guard.until_seen(settings, route, len(pairs) - 1, worker, timeout=60)
        await asyncio.sleep(1.0)  # a wrongly judged poison, or a second letter, would land now
        state = await guard.route_state(fault_stack.redis_url, settings.redis.key_prefix, route)
        assert state.pairs_seen == len(pairs) - 1
        more = await consume_n(
            kafka.bootstrap_servers,
            kafka.topics.dlq,
            2,
            timeout=3,
            strict=False,
            predicate=lambda r: r.key == route.encode(),
        )
        assert len(more) == 1
        assert worker.alive(), worker.log_tail()
    finally:
        worker.stop()


async def test_an_unexpected_failure_exits_before_the_ack_and_the_pairs_are_redelivered(
    fault_stack,  # type: ignore[no-untyped-def]
) -> None:
    settings = guard.isolated_settings(fault_stack, f"qdfault:{uuid.uuid4().hex}:", partitions=2)
    await guard.make_topics(settings)
    kafka = settings.kafka
    route = "agent/crash"
    pairs = healthy(route, 10, seed=62)
    first = FailpointWorker(settings, fault_stack.redis_url, failpoints=("raise:send_score",))
    second: FailpointWorker | None = None
    first.start()
    try:
        await guard.send_pairs(
            kafka.bootstrap_servers,
            kafka.topics.pairs,
            [(route.encode(), p.dumps()) for p in pairs],
        )
        # Scored, then the send raises: the worker exits instead of acknowledging.
        assert await asyncio.to_thread(first.wait_exit, 90) == 70, first.log_tail()
        assert "raise:send_score: raising InjectedFault" in first.stderr()
        assert "not acknowledged; exiting (code 70)" in first.log_tail(20_000)
        state = await guard.route_state(fault_stack.redis_url, settings.redis.key_prefix, route)
        assert state.pairs_seen == 0
        # The same group, a healthy worker: every pair comes back, each judged once.
        second = FailpointWorker(settings, fault_stack.redis_url).start()
        await guard.until_seen(settings, route, len(pairs), second, timeout=90)
        await asyncio.sleep(1.0)
        state = await guard.route_state(fault_stack.redis_url, settings.redis.key_prefix, route)
        assert state.pairs_seen == len(pairs)
    finally:
        first.stop()
        if second is not None:
            second.stop()
