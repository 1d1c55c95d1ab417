"""kill -9 inside a breaker transition, then 20+ kills at random: every transition once.

The judge's dangerous window is a few microseconds wide: between the Lua commit
and the send, between the send and the ack, just before the commit. Failpoints
put the kill exactly there (the worker SIGKILLs itself and says so on stderr);
the random loop then kills workers from outside while a stream walks two routes
through many transitions. Whatever the kill, a gateway's RouteController must
apply each transition exactly once, every command must reach the control topic
at least once, and the route must count every pair once.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from support.guard import make_topics, send_pairs, wait_scored
from support.transitions import (
    FailpointWorker,
    Follower,
    RouteKeys,
    control_commands,
    eventually,
    fast_policy,
    shadow_records,
    transition_settings,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(200)]


@pytest.mark.parametrize("failpoint", ["after_commit", "after_send", "before_commit"])
async def test_kill_9_inside_a_transition_applies_it_exactly_once(
    fault_stack,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    failpoint: str,
) -> None:
    started = time.monotonic()
    route = f"crash/{failpoint}"
    prefix = f"qdfault:{uuid.uuid4().hex}:"
    settings = transition_settings(fault_stack, prefix, fast_policy(tmp_path, cooldown_s=600))
    await make_topics(settings)
    kafka = settings.kafka
    keys = RouteKeys(fault_stack.redis_url, prefix, route)
    gateway = Follower(settings, fault_stack.redis_url, [route])
    first = FailpointWorker(settings, fault_stack.redis_url, failpoints=(failpoint,)).start()
    second: FailpointWorker | None = None
    try:
        await wait_scored(settings, first)
        await gateway.start()
        # Five healthy pairs, then four drifted: the eighth pair trips the breaker.
        stream = shadow_records(route, "fp", "healthy", 5, seed=1)
        stream += shadow_records(route, "fp", "drifted", 4, seed=2)
        await send_pairs(kafka.bootstrap_servers, kafka.topics.pairs, stream)

        # The fault happened, where it was asked to.
        assert first.wait_exit(timeout=60) == -signal.SIGKILL
        assert first.failpoint_line(failpoint) in first.stderr(), first.log_tail()
        at_crash = await keys.state()
        if failpoint == "before_commit":
            assert at_crash.state == "closed" and at_crash.epoch == 0, at_crash
        else:
            assert at_crash.state == "open" and at_crash.epoch > 0, at_crash
            # The crash left the transition's command and alert in the outbox.
            assert await keys.outbox_len() == 2

        second = FailpointWorker(settings, fault_stack.redis_url).start()

        async def settled() -> bool:
            state = await keys.state()
            return (
                state.pairs_seen == len(stream)
                and state.state == "open"
                and await keys.drained()
                and gateway.controller.epoch(route) == state.epoch
            )

        await eventually(settled, 90, f"{route} to settle", second.log_tail)
        state = await keys.state()
        on_topic = await control_commands(settings, route, gateway.verifier)
        sent_epochs = Counter(c.epoch for c in on_topic)
        duplicates = await keys.duplicates()

        assert state.pairs_seen == len(stream), "a pair counted twice or lost"
        assert state.trips == 1, state
        assert [c.action for c in on_topic] == ["rollback"] * len(on_topic)
        assert set(sent_epochs) == {state.epoch}, sent_epochs
        # Exactly once at the gateway, however many times the command travelled.
        assert gateway.epochs(route) == [state.epoch], gateway.applied
        assert gateway.controller.target(route) == "bf16"
        if failpoint in ("after_commit", "after_send"):
            # The decisive score was folded but its offset never committed: the next
            # worker folded it again and the Lua step refused it as already seen.
            assert duplicates >= 1, "no redelivery reached the judge"
        if failpoint == "after_send":
            # Sent, never acked: the next claimant sent the command again.
            assert sent_epochs[state.epoch] >= 2, sent_epochs
        print(
            f"\n{failpoint}: killed pid {first.pid} at the failpoint; epoch {state.epoch} "
            f"on the topic {sent_epochs[state.epoch]}x, applied once "
            f"(via {gateway.applied[0].source}); redelivered folds {duplicates}; "
            f"{time.monotonic() - started:.1f}s"
        )
    finally:
        await gateway.stop()
        await keys.aclose()
        first.kill()
        if second is not None:
            second.stop()


MIN_KILLS = 20
MIN_CYCLES = 2  # per route; two routes: at least 12 transitions
CHAOS_ROUTES = ["chaos/a", "chaos/b"]


async def test_random_kill_9s_over_a_stream_of_transitions(
    fault_stack,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    rng = random.Random(20261130)
    prefix = f"qdfault:{uuid.uuid4().hex}:"
    settings = transition_settings(fault_stack, prefix, fast_policy(tmp_path))
    await make_topics(settings)
    kafka = settings.kafka
    keys = {r: RouteKeys(fault_stack.redis_url, prefix, r) for r in CHAOS_ROUTES}
    gateway = Follower(settings, fault_stack.redis_url, CHAOS_ROUTES)
    # A second gateway, polling the Redis backstop at `quantdrift gateway`'s default pace.
    other = Follower(settings, fault_stack.redis_url, CHAOS_ROUTES, poll_s=0.5)
    # Two workers in the group: a kill stalls the victim's partitions until the
    # group rebalances, and its replacement starts at once. The first two are armed at
    # `after_commit`: whichever commits the first transition dies inside it, so at
    # least one kill lands in the window that matters, whatever the random kills hit
    # (random moments alone missed it in some runs: no redelivery at all).
    armed = ("after_commit",)
    workers = [
        FailpointWorker(settings, fault_stack.redis_url, failpoints=armed).start() for _ in range(2)
    ]
    retired: list[FailpointWorker] = []
    kills: list[tuple[float, int, int]] = []  # (seconds into the run, pid, exit status)
    sent = dict.fromkeys(CHAOS_ROUTES, 0)
    cycles = dict.fromkeys(CHAOS_ROUTES, 0)
    done = asyncio.Event()

    def logs() -> str:
        return "\n---\n".join(w.log_tail(1500) for w in workers)

    async def chaos() -> None:
        # MIN_KILLS kills, then the stream finishes its cycles in peace: kills beyond the
        # minimum only stretched the run (each one stalls its partitions until the group
        # rebalances) toward the test's timeout on a loaded machine.
        while not done.is_set() and len(kills) < MIN_KILLS:
            # The random moment of the next kill (this is the fault, not a wait for order).
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            slot = rng.randrange(len(workers))
            victim = workers[slot]
            if victim.failpoints and victim.alive():
                continue  # armed: it kills itself at its first transition
            if not victim.failpoints and not victim.alive():
                continue
            status = victim.kill_9()  # an armed worker that died: its status, reaped
            kills.append((time.monotonic() - started, victim.pid or 0, status))
            retired.append(victim)
            workers[slot] = FailpointWorker(settings, fault_stack.redis_url).start()

    async def until(route: str, breaker: str, what: str) -> None:
        async def reached() -> bool:
            state = await keys[route].state()
            return (
                state.state == breaker
                and state.pairs_seen == sent[route]
                and gateway.controller.epoch(route) == state.epoch
            )

        await eventually(reached, 90, f"{route}: {what}", logs)

    async def drive(route: str, seed: int) -> None:
        n = 0
        while cycles[route] < MIN_CYCLES or len(kills) < MIN_KILLS:
            for kind, count, breaker, what in (
                ("drifted", 3, "open", "rollback"),
                (None, 0, "half_open", "cool-down over: canary"),
                ("healthy", 2, "closed", "probes passed: restore"),
            ):
                if kind is not None:
                    records = shadow_records(route, f"c{n}", kind, count, seed=seed + n)
                    n += 1
                    await send_pairs(kafka.bootstrap_servers, kafka.topics.pairs, records)
                    sent[route] += len(records)
                await until(route, breaker, what)
            cycles[route] += 1

    try:
        await wait_scored(settings, workers[0])
        await gateway.start()
        await other.start()
        chaos_task = asyncio.create_task(chaos())
        try:
            await asyncio.gather(*(drive(r, 100 * i) for i, r in enumerate(CHAOS_ROUTES)))
        finally:
            done.set()
            await chaos_task
        for route in CHAOS_ROUTES:
            await eventually(keys[route].drained, 60, f"{route}: outbox drained", logs)

            async def caught_up(route: str = route) -> bool:
                return other.controller.epoch(route) == gateway.controller.epoch(route)

            await eventually(caught_up, 10, f"{route}: the second gateway caught up")

        transitions = 0
        redelivered = 0
        for route in CHAOS_ROUTES:
            state = await keys[route].state()
            on_topic = await control_commands(settings, route, gateway.verifier)
            sent_epochs = Counter(c.epoch for c in on_topic)
            applied = gateway.epochs(route)
            assert state.pairs_seen == sent[route], f"{route}: {state.pairs_seen} of {sent[route]}"
            assert state.trips == cycles[route], state
            # Every transition applied once, in order, by each gateway ...
            assert gateway.actions(route) == ["rollback", "canary", "restore"] * cycles[route]
            assert len(set(applied)) == len(applied) and applied == sorted(applied), applied
            assert other.epochs(route) == applied, (other.applied, applied)
            # ... and every one of them reached the control topic at least once.
            assert set(sent_epochs) == set(applied), (sent_epochs, applied)
            transitions += len(applied)
            redelivered += await keys[route].duplicates()
            redelivered += sum(n - 1 for n in sent_epochs.values())
        assert len(kills) >= MIN_KILLS
        assert all(status == -signal.SIGKILL for _, _, status in kills), kills
        assert any(
            w.failpoints and w.failpoint_line("after_commit") in w.stderr() for w in retired
        ), "no armed worker died at its failpoint"
        assert transitions >= 10
        assert redelivered > 0, "20 kills and not one redelivery: the kills missed the stream"
        print(
            f"\n{len(kills)} kill -9s (first at {kills[0][0]:.1f}s, last at {kills[-1][0]:.1f}s) "
            f"over {transitions} transitions on {len(CHAOS_ROUTES)} routes, "
            f"{sum(sent.values())} pairs; each transition applied once by each of 2 gateways; "
            f"redeliveries (folds refused + repeated sends) {redelivered}; "
            f"{time.monotonic() - started:.1f}s"
        )
    finally:
        await gateway.stop()
        await other.stop()
        for k in keys.values():
            await k.aclose()
        for w in workers:
            w.stop()
        for w in retired:
            w.kill()
