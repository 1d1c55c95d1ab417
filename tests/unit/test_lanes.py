"""The score agent's two lanes, in process: fake scorers, real threads, gates for timing.

What the agent relies on: a pair the static lane settles is sent while an
escalation of another route waits; a route's own later pairs wait for it; every
pair is released (acknowledged) only once the broker confirmed its outcome, and a
refused send is sent again, the worker exiting past the bound; a failing step
costs only the pairs that fail alone; a failure while sending is never silent.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import pytest

from quantdrift.schemas import Metrics, ModelOutput, PairEvent, ScoreEvent
from quantdrift.streams.delivery import Backoff, Send
from quantdrift.streams.lanes import Held, Outcome, ScoreLanes, StagedScores, Waiting


class Crashed(BaseException):
    """What the test's ``crash`` raises: not an Exception, so no lane catches it."""


def pair(pid: str, route: str) -> PairEvent:
    return PairEvent(
        pair_id=pid,
        ts=1.0,
        route=route,
        candidate=ModelOutput(text=f"{pid} c"),
        reference=ModelOutput(text=f"{pid} r"),
    )


def score(p: PairEvent) -> ScoreEvent:
    return ScoreEvent(
        pair_id=p.pair_id, route=p.route, kind="shadow", ts=1.0, metrics=Metrics(), verdict="ok"
    )


class Harness:
    """Pairs whose id starts with ``slow`` escalate; the escalation lane waits on ``gate``."""

    def __init__(
        self,
        max_waiting: int = 8,
        poison: str = "",
        fail: str = "",
        chunk: int = 1,
        give_up_s: float = 1.0,
    ) -> None:
        self.gate = threading.Event()
        self.sent: list[str] = []
        self.acked: list[str] = []
        self.crashed: list[str] = []
        self.finish_calls: list[int] = []
        self.steps: list[list[str]] = []  # the pair ids of each static step, in order
        self.sent_after: dict[str, int] = {}  # pair id -> static steps done when it left
        self.poison, self.fail = poison, fail
        self.refusals: dict[str, int] = {}  # pair id -> how many attempts the broker refuses
        self.unanswered: set[str] = set()  # pair ids whose broker answer the test gives
        self.answers: dict[str, asyncio.Future[object]] = {}
        self.static = ThreadPoolExecutor(1)
        self.escalation = ThreadPoolExecutor(1)
        self.lanes = ScoreLanes(
            stage=self.stage,
            finish=self.finish,
            alone=self.alone,
            emit=self.emit,
            crash=self.crash,
            static_lane=self.static,
            escalation_lane=self.escalation,
            max_waiting=max_waiting,
            chunk=chunk,
            backoff=Backoff(first_s=0.01, max_s=0.05, give_up_s=give_up_s),
        )

    def stage(self, pairs: list[PairEvent]) -> StagedScores:
        self.steps.append([p.pair_id for p in pairs])
        if any(p.pair_id == self.poison for p in pairs):
            raise RuntimeError("poison in the batch")
        ready = {i: score(p) for i, p in enumerate(pairs) if not p.pair_id.startswith("slow")}
        waiting = tuple(i for i in range(len(pairs)) if i not in ready)
        return StagedScores(ready, waiting, pairs)

    def finish(self, waiting: list[Waiting]) -> list[ScoreEvent]:
        assert self.gate.wait(10), "the test never opened the escalation gate"
        self.finish_calls.append(len(waiting))
        if self.fail == "finish":
            raise RuntimeError("full model failed")
        return [score(w.staged.token[w.index]) for w in waiting]  # type: ignore[index]

    def alone(self, p: PairEvent) -> ScoreEvent:
        if p.pair_id == self.poison:
            raise ValueError("cannot score this pair")
        return score(p)

    def emit(self, p: PairEvent, outcome: Outcome) -> Send:
        name = p.pair_id if isinstance(outcome, ScoreEvent) else f"dlq:{p.pair_id}"

        async def send() -> Awaitable[object]:
            if self.fail == "emit" and p.pair_id.startswith("slow"):
                raise ConnectionError("the producer refused the record")
            self.sent.append(name)
            self.sent_after[p.pair_id] = len(self.steps)
            answer = asyncio.get_running_loop().create_future()
            if self.refusals.get(p.pair_id, 0) > 0:
                self.refusals[p.pair_id] -= 1
                answer.set_exception(TimeoutError("the broker did not answer"))
            elif p.pair_id in self.unanswered:
                self.answers[p.pair_id] = answer
            else:
                answer.set_result(None)
            return answer

        return send

    def crash(self, what: str, n: int) -> NoReturn:
        self.crashed.append(what)
        raise Crashed(what)  # the worker exits the process; here the lane's task ends loudly

    def held(self, *ids_routes: tuple[str, str]) -> list[Held]:
        return [
            Held(pair(pid, route), lambda pid=pid: self.acked.append(pid))  # type: ignore[misc]
            for pid, route in ids_routes
        ]

    async def until(self, predicate, what: str) -> None:  # type: ignore[no-untyped-def]
        for _ in range(1000):
            if predicate():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}: sent {self.sent}")


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.gate.set()
    h.static.shutdown(wait=True)
    h.escalation.shutdown(wait=True)


async def test_a_settled_pair_is_sent_while_another_routes_escalation_waits(harness) -> None:  # type: ignore[no-untyped-def]
    h = harness
    await h.lanes.submit(h.held(("slow-a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b")))
    # submit returned with the escalation still blocked: b's pairs are out, a1 waits
    # behind a0 (its route's order), and nothing unsent is acknowledged.
    assert h.sent == ["b0", "b1"]
    await h.until(lambda: h.acked == ["b0", "b1"], "the broker's answers")
    assert h.lanes.in_flight == 2
    h.gate.set()
    await h.until(lambda: len(h.sent) == 4, "the escalated pair")
    assert h.sent == ["b0", "b1", "slow-a0", "a1"]
    await h.until(lambda: h.acked == h.sent, "the broker's answers")


async def test_a_short_pair_leaves_before_its_batchs_long_pairs_are_staged(harness) -> None:  # type: ignore[no-untyped-def]
    """Judge input first: the pair that settles a route is usually short; it must not wait
    for the static lane to stage the long pairs of other routes batched with it."""
    h = harness
    long = [(f"long{i:02d}-" + "x" * 100, f"load/{i % 4}") for i in range(20)]
    batch = [("a0-" + "x" * 120, "a"), *long, ("a1", "a"), ("t0", "trial")]
    await h.lanes.submit(h.held(*batch))
    assert [len(step) for step in h.steps] == [16, 7]  # stage_chunk pairs per step
    assert {"t0", "a1"} <= set(h.steps[0])  # shortest first
    assert h.sent_after["t0"] == 1  # sent before the second step started
    # A route's order holds: a1 was staged first but leaves after its route's a0.
    assert h.sent_after["a1"] == 2
    assert h.sent.index("a0-" + "x" * 120) < h.sent.index("a1")
    assert sorted(h.sent) == sorted(pid for pid, _ in batch)
    await h.until(lambda: h.acked == h.sent, "the broker's answers")


async def test_escalations_run_a_chunk_at_a_time_oldest_first() -> None:
    """A batch staged meanwhile waits for one chunk at most, not the lane's backlog."""
    h = Harness(chunk=2)
    try:
        await h.lanes.submit(h.held(("slow-a0", "a")))
        await h.until(lambda: h.lanes.waiting == 1 and not h.lanes._queue, "the lane to take a0")
        await h.lanes.submit(h.held(("slow-a1", "a"), ("b0", "b"), ("slow-a2", "a")))
        await h.lanes.submit(h.held(("slow-c0", "c")))
        assert h.sent == ["b0"]
        h.gate.set()
        await h.until(lambda: len(h.sent) == 5, "every escalation")
        assert h.sent == ["b0", "slow-a0", "slow-a1", "slow-a2", "slow-c0"]
        assert h.finish_calls == [1, 2, 1]  # a0 (it was running), then a1 a2, then c0
    finally:
        h.gate.set()
        h.static.shutdown()
        h.escalation.shutdown()


async def test_the_agent_takes_no_new_batch_while_the_lane_is_full() -> None:
    h = Harness(max_waiting=1)
    try:
        await h.lanes.submit(h.held(("slow-a0", "a")))
        second = asyncio.create_task(h.lanes.submit(h.held(("slow-b0", "b"))))
        await asyncio.sleep(0.2)
        assert not second.done(), "a second batch was queued past max_waiting"
        h.gate.set()
        await asyncio.wait_for(second, 10)
        await h.until(lambda: len(h.sent) == 2, "both escalations")
    finally:
        h.gate.set()
        h.static.shutdown()
        h.escalation.shutdown()


async def test_a_poison_pair_costs_only_itself_and_keeps_its_place() -> None:
    h = Harness(poison="a1")
    h.gate.set()
    try:
        await h.lanes.submit(h.held(("a0", "a"), ("a1", "a"), ("a2", "a")))
        assert h.sent == ["a0", "dlq:a1", "a2"]
        await h.until(lambda: h.acked == ["a0", "a1", "a2"], "the broker's answers")
    finally:
        h.static.shutdown()
        h.escalation.shutdown()


async def test_a_failing_escalation_scores_its_pairs_alone() -> None:
    h = Harness(fail="finish")
    h.gate.set()
    try:
        await h.lanes.submit(h.held(("slow-a0", "a"), ("a1", "a")))
        await h.until(lambda: len(h.sent) == 2, "the pairs scored alone")
        assert h.sent == ["slow-a0", "a1"]
    finally:
        h.static.shutdown()
        h.escalation.shutdown()


async def test_a_send_failing_on_the_escalation_lane_crashes_and_acks_nothing() -> None:
    h = Harness(fail="emit")
    h.gate.set()
    try:
        await h.lanes.submit(h.held(("slow-a0", "a"), ("a1", "a")))
        await h.until(lambda: h.crashed, "the crash")
        assert h.crashed == ["score agent (escalation lane)"]
        assert h.lanes._escalator is not None
        with pytest.raises(Crashed):
            await h.lanes._escalator  # the lane's task ended with the crash, not quietly
        assert h.acked == []  # neither the failed send nor the pair behind it
    finally:
        h.static.shutdown()
        h.escalation.shutdown()


async def test_a_pair_is_acknowledged_only_once_the_broker_confirms_its_score(harness) -> None:  # type: ignore[no-untyped-def]
    harness.unanswered.add("a1")
    await harness.lanes.submit(harness.held(("a1", "a"), ("b1", "b")))
    assert harness.sent == ["a1", "b1"] or harness.sent == ["b1", "a1"]  # both handed on
    await harness.until(lambda: harness.acked == ["b1"], "b1's ack")
    assert harness.lanes.in_flight == 1  # handed to the producer is not delivered
    harness.answers["a1"].set_result(None)
    await harness.until(lambda: sorted(harness.acked) == ["a1", "b1"], "a1's ack")
    assert harness.lanes.in_flight == 0


async def test_a_refused_score_is_sent_again_until_the_broker_takes_it(harness) -> None:  # type: ignore[no-untyped-def]
    harness.refusals["a1"] = 3
    await harness.lanes.submit(harness.held(("a1", "a")))
    await harness.until(lambda: harness.acked == ["a1"], "a1's ack after the retries")
    assert harness.sent == ["a1"] * 4
    assert not harness.crashed


async def test_a_score_the_broker_never_takes_crashes_past_the_bound_unacked() -> None:
    h = Harness(give_up_s=0.2)
    h.refusals["a1"] = 10**6
    try:
        await h.lanes.submit(h.held(("a1", "a"), ("b1", "b")))
        await h.until(lambda: h.crashed, "the crash")
        assert h.crashed == ["score agent (score for pair a1)"]
        assert h.acked == ["b1"]  # a1 stays unacknowledged: the restarted worker reads it
        assert h.sent.count("a1") > 2
    finally:
        h.static.shutdown(wait=True)
