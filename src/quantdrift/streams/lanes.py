"""The score agent's two lanes: no score waits for an escalation it does not need.

Measured before this split (``bench/e2e.py``, one worker at 40 and 60 pairs/s):
the tail of decisive pair -> gateway switch was a batch, or the batch before it,
waiting 200-400 ms for MiniLM on some *other* pair the tiered scorer escalated,
while the pair itself was final after the static tier. So a batch is scored in
two steps, on two single-thread executors:

* the *static* lane stages the batch (:func:`~quantdrift.embedding.batch.stage_batch`),
  shortest pairs first, ``stage_chunk`` pairs per step: every pair that does not
  escalate gets its final score, which is sent as soon as its step is done (see
  "Judge input first" below);
* the *escalation* lane finishes the escalated pairs, oldest first, ``chunk``
  pairs per full-model call (one by default: each escalated pair, and the pairs
  of its route behind it, leave as soon as its own embedding is done), while the
  static lane already works on the next batches. At most ``max_waiting`` pairs
  wait on it; the agent takes no new batch beyond that (backpressure, not an
  unbounded queue).

Two threads, not one queue on one thread: MiniLM (torch) releases the GIL inside
its operations, so the static lane runs while it embeds. Both lanes on one
thread was tried: every staged batch then waits for the pair MiniLM is on at
that moment (~100-250 ms a long pair on one core), which alone spends the
250 ms switch budget. The price: the worker can use two cores at once for the
same total work, and MiniLM runs slower while the static lane holds the GIL
(2.3x in one measurement on a shared machine with the static lane busy all the
time; staging costs ~1.6 ms a long pair, so at 40 pairs/s it is busy ~6 % of it).

Judge input first. A pair that settles a route is usually a short one (a broken
answer, a loop cut at ``max_tokens`` is the exception and is long anyway), and the
judge can only act once its score is on the scores topic. Staged whole, a batch of
64 sent its first score after the last long pair of the batch was staged (~1.6 ms
each on one core, 2-3x that while MiniLM holds the other thread): ~100-250 ms a
short pair waited behind long ones *of other routes*, which spends most of the
250 ms switch budget. So a batch is staged shortest first, ``stage_chunk`` pairs
at a time, and each step's settled scores leave before the next step starts; the
escalated pairs of a step join the escalation queue then. The order the judge
folds a route's scores in does not move: the sequencer below still releases each
route's scores in arrival order, so sorting by size only reorders routes against
each other, which decides nothing.

What this must not change:

* **Nothing lost, acks after the broker has it.** The agent holds one extra
  reference on each pair's record, released (:attr:`Held.done`) only once the
  broker confirmed that pair's score (or dead letter). Faust commits an offset only
  when every offset below it is acknowledged, so a crash while escalations or
  confirmations wait redelivers those pairs (the judge drops pair ids it folded).
  Sends stay pipelined: the lanes hand each score to the producer and go on; the
  broker's answer releases the pair from a callback. A send the broker refuses or
  lets time out is sent again with backoff, and past the bound the worker exits
  (``streams/delivery.py`` says why an exit and not the DLQ). A resent score may
  land behind its route's later scores, as a redelivered one after a crash already
  can: the order is then moved by a transport fault, never by a score's value.
* **A route's order.** Outcomes leave through a
  :class:`~quantdrift.streams.sequencing.RouteSequencer`: a route's scores go out
  in the order its pairs arrived, so an escalated pair holds back its own route's
  later pairs, never another route's. Escalation is decided by the static cosine,
  a value; sending escalated pairs "when ready" would let values choose the
  judge's folding order, which the e-detectors' validity forbids (see the
  sequencer's docstring and ``schemas/record_keys.py``).
* **Scores.** Staging and finishing give each pair the metrics
  :func:`~quantdrift.embedding.factory.score_with` gives it (they are its two
  halves), so live, replay and eval still agree.
* **A poison pair costs only itself.** A lane whose step raises scores that step's
  pairs one by one (``alone``); only the pairs that still fail are dead-lettered
  (a static step is ``stage_chunk`` pairs, not the whole batch).
  Anything else failing in a lane (a send the producer refuses at handoff, a score
  the broker would not take within the bound) is handed to ``crash``, which exits
  before the waiting pairs are acknowledged: no lane task dies silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import NoReturn

from quantdrift.schemas import PairEvent, ScoreEvent
from quantdrift.streams.delivery import Backoff, Send, Undelivered, redeliver
from quantdrift.streams.sequencing import RouteSequencer

log = logging.getLogger("quantdrift.worker")

Outcome = ScoreEvent | Exception
"""A pair's score, or why scoring it failed even alone (the agent dead-letters it)."""


@dataclass(frozen=True, slots=True)
class StagedScores:
    """A batch after the static lane: final scores by index, and what the rest needs.

    ``token`` is the scorer's own record of the waiting pairs (``finish`` reads it).
    """

    ready: dict[int, ScoreEvent]
    waiting: tuple[int, ...] = ()
    token: object = None


@dataclass(frozen=True, slots=True)
class Held:
    """One pair in flight: what the agent needs to send its outcome and release its record."""

    pair: PairEvent
    done: Callable[[], None]


@dataclass(frozen=True, slots=True)
class Waiting:
    """One escalated pair waiting for the full model: its batch's staging and its index."""

    staged: StagedScores
    index: int


Ticket = tuple[int, int]
"""(batch, index in the batch): a pair's place in the sequencer."""


@dataclass(frozen=True, slots=True)
class _Unit:
    ticket: Ticket
    held: Held
    waiting: Waiting


def pair_size(pair: PairEvent) -> int:
    """What staging a pair costs, roughly: the characters of both answers."""
    return len(pair.candidate.text) + len(pair.reference.text)


@dataclass
class ScoreLanes:
    """Stage on one lane, escalate a few pairs at a time on the other, send in per-route order.

    ``finish`` gets some waiting pairs and returns their scores, in order.
    """

    stage: Callable[[list[PairEvent]], StagedScores]
    finish: Callable[[list[Waiting]], list[ScoreEvent]]
    alone: Callable[[PairEvent], ScoreEvent]
    emit: Callable[[PairEvent, Outcome], Send]
    """What sends a pair's outcome (called once a pair; its result is called per attempt)."""
    crash: Callable[[str, int], NoReturn]
    static_lane: Executor
    escalation_lane: Executor
    max_waiting: int = 64
    """Escalated pairs waiting at most; the agent takes no new batch beyond that."""
    chunk: int = 1
    """Pairs per full-model call: what a batch staged meanwhile waits for at most."""
    stage_chunk: int = 16
    """Pairs per static step, shortest first: what a short pair waits for at most."""
    backoff: Backoff = field(default_factory=Backoff)
    """How a send the broker refused is retried, and for how long."""
    _sequencer: RouteSequencer[tuple[Held, Outcome]] = field(default_factory=RouteSequencer)
    _batches: int = 0
    _unacked: int = 0
    _queue: deque[_Unit] = field(default_factory=deque)
    _running: int = 0
    _escalator: asyncio.Task[None] | None = None
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _space: asyncio.Event = field(default_factory=asyncio.Event)
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _resending: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def in_flight(self) -> int:
        """Pairs taken and not yet released (their records are not acknowledged)."""
        return self._unacked

    @property
    def waiting(self) -> int:
        """Escalated pairs queued on, or being finished by, the escalation lane."""
        return len(self._queue) + self._running

    async def submit(self, held: Sequence[Held]) -> None:
        """Score a batch; return once its final scores are sent and its escalations queued.

        Returns only while fewer than ``max_waiting`` pairs wait on escalations, so
        the caller taking the next batch is the backpressure.
        """
        if not held:
            return
        batch = self._batches
        self._batches += 1
        self._unacked += len(held)
        for i, h in enumerate(held):
            self._sequencer.add((batch, i), h.pair.route)
        order = sorted(range(len(held)), key=lambda i: pair_size(held[i].pair))
        for start in range(0, len(order), self.stage_chunk):
            step = order[start : start + self.stage_chunk]
            await self._stage([((batch, i), held[i]) for i in step])

    async def _stage(self, work: list[tuple[Ticket, Held]]) -> None:
        """One static step: send what it settles, queue what it escalates."""
        pairs = [h.pair for _, h in work]
        loop = asyncio.get_running_loop()
        staged: StagedScores | None = None
        try:
            staged = await loop.run_in_executor(self.static_lane, self.stage, pairs)
        except Exception:
            log.exception("scoring failed for a batch of %d pairs; scoring each alone", len(pairs))
            await self._alone(work, self.static_lane)
        if staged is not None:
            for i, score in staged.ready.items():
                ticket, h = work[i]
                self._sequencer.settle(ticket, (h, score))
        await self._send_released()
        if staged is None or not staged.waiting:
            return
        while self.waiting >= self.max_waiting:
            self._space.clear()
            await self._space.wait()
        for i in staged.waiting:
            ticket, h = work[i]
            self._queue.append(_Unit(ticket, h, Waiting(staged, i)))
        if self._escalator is None or self._escalator.done():
            self._escalator = asyncio.create_task(self._escalate_forever())
        self._wake.set()

    async def _escalate_forever(self) -> None:
        """The escalation lane's one task: the oldest waiting pairs, ``chunk`` at a time."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queue:
                    units = [
                        self._queue.popleft() for _ in range(min(self.chunk, len(self._queue)))
                    ]
                    self._running = len(units)
                    await self._finish(units)
                    self._running = 0
                    self._space.set()
        except Exception:
            self.crash("score agent (escalation lane)", self.in_flight)

    async def _finish(self, units: list[_Unit]) -> None:
        loop = asyncio.get_running_loop()
        try:
            scores = await loop.run_in_executor(
                self.escalation_lane, self.finish, [u.waiting for u in units]
            )
        except Exception:
            log.exception("escalation failed for %d pairs; scoring each alone", len(units))
            await self._alone([(u.ticket, u.held) for u in units], self.escalation_lane)
        else:
            for unit, score in zip(units, scores, strict=True):
                self._sequencer.settle(unit.ticket, (unit.held, score))
        await self._send_released()

    async def _alone(self, work: Sequence[tuple[Ticket, Held]], lane: Executor) -> None:
        """Score each pair on its own: one poison pair must not cost its neighbours."""
        loop = asyncio.get_running_loop()
        for ticket, held in work:
            outcome: Outcome
            try:
                outcome = await loop.run_in_executor(lane, self.alone, held.pair)
            except Exception as exc:
                log.exception("scoring failed for pair %s; dead-lettered", held.pair.pair_id)
                outcome = exc
            self._sequencer.settle(ticket, (held, outcome))

    async def _send_released(self) -> None:
        """Send what the sequencer frees, in its order; one sender at a time keeps it."""
        async with self._send_lock:
            for h, outcome in self._sequencer.release():
                send = self.emit(h.pair, outcome)
                self._confirm(h, send, await send())

    def _confirm(self, held: Held, send: Send, answer: Awaitable[object]) -> None:
        """Release the pair when the broker confirms; resend in a task if it does not."""

        def settled(future: asyncio.Future[object]) -> None:
            if future.cancelled():
                return  # the worker is stopping: the pair stays unacknowledged, redelivered
            failure = future.exception()
            if failure is None:
                self._release(held)
                return
            task = asyncio.get_running_loop().create_task(self._resend(held, send, failure))
            self._resending.add(task)
            task.add_done_callback(self._resending.discard)

        asyncio.ensure_future(answer).add_done_callback(settled)

    async def _resend(self, held: Held, send: Send, failure: BaseException) -> None:
        what = f"score for pair {held.pair.pair_id}"
        try:
            await redeliver(send, failure, what=what, backoff=self.backoff)
        except Undelivered:
            self.crash(f"score agent ({what})", self.in_flight)
        self._release(held)

    def _release(self, held: Held) -> None:
        held.done()
        self._unacked -= 1
