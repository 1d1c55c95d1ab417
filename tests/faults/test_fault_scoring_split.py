"""Score anywhere, judge per route: one route's pairs spread over several workers.

Pairs are keyed by pair id, so one busy route is scored by every worker;
scores, commands and alerts stay keyed by route, so one worker judges it.
These run real ``quantdrift worker`` processes on the embedded broker and a
Redis the suite owns, and read each worker's own counters from its web port.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import defaultdict

import pytest

from quantdrift.schemas import ScoreEvent, unverified_score
from support import guard
from support.kafka import consume_n
from support.scoring_split import (
    PacedProducer,
    healthy_then_drifted,
    judged,
    tier_counts,
    warm_all,
    worker_counts,
    worker_with_web,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def scores_by_pair(settings, route: str) -> dict[str, list[ScoreEvent]]:  # type: ignore[no-untyped-def]
    """Every score record of ``route`` on the scores topic (keyed by route), by pair id."""
    kafka = settings.kafka
    got = await consume_n(kafka.bootstrap_servers, kafka.topics.scores, 1_000_000, strict=False)
    out: dict[str, list[ScoreEvent]] = defaultdict(list)
    for rec in got:
        score = unverified_score(rec.value)  # the signed envelope's payload
        if score.route == route:
            assert rec.key == route.encode(), f"score keyed {rec.key!r}, not by its route"
            out[score.pair_id].append(score)
    return out


def same_score(a: ScoreEvent, b: ScoreEvent) -> bool:
    """A pair scored twice (by two workers) must carry the same verdict and metrics."""
    if (a.verdict, a.reasons, a.drift_score) != (b.verdict, b.reasons, b.drift_score):
        return False
    ma, mb = a.metrics.model_dump(), b.metrics.model_dump()
    for name, x in ma.items():
        y = mb[name]
        if isinstance(x, float) and isinstance(y, float):
            if not math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6):
                return False
        elif x != y:
            return False
    return True


async def test_one_route_is_scored_by_two_workers_and_decided_once(fault_stack) -> None:  # type: ignore[no-untyped-def]
    route = "split/r0"
    settings = guard.isolated_settings(fault_stack, f"qdfault:{uuid.uuid4().hex}:", partitions=2)
    await guard.make_topics(settings)
    workers = [worker_with_web(settings, fault_stack.redis_url) for _ in range(2)]
    try:
        await warm_all(settings, workers)
        before = [(await worker_counts(port))["pairs_scored"] for _, port in workers]
        tiers_before = [await tier_counts(port) for _, port in workers]
        pairs = healthy_then_drifted(route, healthy=30, drifted=12, seed=7)
        producer = PacedProducer(
            settings.kafka.bootstrap_servers, settings.kafka.topics.pairs, pairs, 40.0
        )
        await producer.run()
        deadline = time.monotonic() + 120
        while (await judged(settings, [route])) < len(pairs):
            for worker, _ in workers:
                assert worker.alive(), worker.log_tail()
            assert time.monotonic() < deadline, "route not fully judged"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # a late duplicate or second transition would land now
        after = [await worker_counts(port) for _, port in workers]
        scored = [a["pairs_scored"] - b for a, b in zip(after, before, strict=True)]
        # Both workers scored this one route: the split the layout exists for.
        assert all(n > 0 for n in scored), f"pairs scored per worker: {scored}"
        assert sum(scored) == len(pairs), f"scored {scored}, sent {len(pairs)} (no fault here)"
        await guard.decided_once(settings, {route: len(pairs)})
        by_pair = await scores_by_pair(settings, route)
        assert sorted(by_pair) == sorted(p.pair_id for p in pairs)
        # Each worker's /metrics counts the pairs its static tier saw and those it
        # escalated; over both workers they are this stream's, as its scores say.
        tiers = [await tier_counts(port) for _, port in workers]
        moved = {
            k: sum(a.get(k, 0.0) - b.get(k, 0.0) for a, b in zip(tiers, tiers_before, strict=True))
            for k in ("pairs", "band", "sample")
        }
        minilm = sum(s.metrics.cosine_tier == "minilm" for (s,) in by_pair.values())
        assert moved["pairs"] == len(pairs), f"tier counters {moved}, {len(pairs)} pairs sent"
        assert moved["band"] + moved["sample"] == minilm, f"{moved}, {minilm} MiniLM scores"
        print(f"\npairs of one route scored per worker: {scored}; tier counters: {moved}")
    finally:
        for worker, _ in workers:
            worker.stop()


async def test_two_scoring_workers_killed_in_turn_every_pair_judged_once(fault_stack) -> None:  # type: ignore[no-untyped-def]
    """Three workers score two routes; two are kill -9'd in turn while pairs are in flight.

    The workers run the default tiered scorer, whose escalation to MiniLM is a function
    of the pair (its texts and static cosine), so a pair redelivered to another worker
    must come back with the same tier, cosine and verdict.
    """
    routes = ["split/k0", "split/k1"]
    settings = guard.isolated_settings(fault_stack, f"qdfault:{uuid.uuid4().hex}:", partitions=4)
    assert settings.embedding.tier == "tiered"
    await guard.make_topics(settings)
    stream = []
    per_route = 0
    for i, route in enumerate(routes):
        pairs = healthy_then_drifted(route, healthy=60, drifted=20, seed=30 + i)
        per_route = len(pairs)
        stream.append(pairs)
    # Interleave the routes so each kill cuts both routes' streams.
    interleaved = [p for group in zip(*stream, strict=True) for p in group]
    total = len(interleaved)
    workers = [worker_with_web(settings, fault_stack.redis_url) for _ in range(3)]
    kills: list[dict[str, int]] = []
    try:
        await warm_all(settings, workers)
        # The last quarter waits until both kills are done: each kill then cuts a stream
        # with pairs still to come, whatever backlog the survivors clear in a burst.
        producer = PacedProducer(
            settings.kafka.bootstrap_servers,
            settings.kafka.topics.pairs,
            interleaved,
            20.0,
            hold_at=total * 3 // 4,
        )
        producing = asyncio.create_task(producer.run())
        deadline = time.monotonic() + 120
        for victim, threshold in ((0, total // 4), (1, total // 2)):
            worker, port = workers[victim]
            # Kill only while pairs are in flight (sent, not yet judged), or, once the
            # survivors have cleared the backlog up to the held tail, with the tail to come.
            # The victim's counters are read first: the check and the kill are one Redis
            # read apart, not an HTTP call to a busy worker.
            while True:
                counts = await worker_counts(port)
                seen, sent = await judged(settings, routes), producer.sent
                if threshold <= seen and (seen < sent or producer.holding):
                    break
                assert time.monotonic() < deadline, f"{seen}/{sent}\n{worker.log_tail()}"
                assert not producing.done() or producing.exception() is None
                await asyncio.sleep(0.02)
            worker.kill()
            seen_after = await judged(settings, routes)
            kills.append(
                {"victim": victim, "scored": counts["pairs_scored"], "sent": sent, "seen": seen}
            )
            # The victim had been scoring this stream, and the judge had not folded
            # every sent pair when it died (nor right after): pairs were in flight.
            assert counts["pairs_scored"] > 0, f"worker {victim} never scored"
            assert seen_after < total, f"kill {victim} landed after the stream was judged"
            assert worker.proc is not None and worker.proc.returncode == -9
        producer.release.set()
        await producing
        survivor, survivor_port = workers[2]
        deadline = time.monotonic() + 120
        while (await judged(settings, routes)) < total:
            assert survivor.alive(), survivor.log_tail()
            assert time.monotonic() < deadline, (
                f"{await judged(settings, routes)}/{total} judged\n{survivor.log_tail()}"
            )
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # any late redelivery would land now
        await guard.decided_once(settings, dict.fromkeys(routes, per_route))
        # A pair scored twice (redelivered to another worker after a kill) carries the
        # same score from both: decisions do not depend on which worker scored it.
        rescored = rescored_minilm = escalated = 0
        for route in routes:
            for pair_id, scores in (await scores_by_pair(settings, route)).items():
                rescored += len(scores) > 1
                minilm = scores[0].metrics.cosine_tier == "minilm"
                escalated += minilm
                rescored_minilm += minilm and len(scores) > 1
                assert all(same_score(scores[0], s) for s in scores[1:]), pair_id
        # The stream's pairs near the bar (fixed by their texts) went to MiniLM: the
        # comparison above ran over both tiers, not the static one alone.
        assert escalated > 0, "no pair escalated: the workers did not run the tiered scorer"
        survivor_counts = await worker_counts(survivor_port)
        print(
            f"\nkills: {kills}; {total} pairs judged once each; "
            f"{rescored} pairs scored twice ({rescored_minilm} on MiniLM); {escalated} escalated; "
            f"survivor saw {survivor_counts['duplicates']} dups"
        )
    finally:
        for worker, _ in workers:
            worker.stop()
