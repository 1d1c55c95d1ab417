"""The score agent's stage: pair records in; signed scores, or dead letters, out.

Bad records go to the DLQ with the reason; the pairs go through the two lanes
(``lanes.py``): a pair the static tier settles is sent at once, the pairs it
escalates finish on their own thread, each route's order kept, and every pair's
record is acknowledged only after its score is sent. What the agent keeps is the
``take_events`` loop and the crash exit (``agents.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

from quantdrift.breaker.policy import Policy
from quantdrift.detectors import Embedder
from quantdrift.embedding.batch import finish_batch, score_batch, stage_batch
from quantdrift.embedding.tiered import Staged
from quantdrift.failpoints import Failpoint, no_failpoint
from quantdrift.schemas import CommandSigner, DeadLetter, PairEvent, ScoreEvent
from quantdrift.streams.app import Topics
from quantdrift.streams.dead_letters import DeadLetterSink
from quantdrift.streams.delivery import Backoff, Send
from quantdrift.streams.handlers import RawRecord, parse_batch
from quantdrift.streams.lanes import Held, ScoreLanes, StagedScores, Waiting
from quantdrift.streams.stats import WorkerStats


class ScoreStage:
    """Scores batches of pair records for the score agent (one instance per worker).

    ``embedder`` is called for the scorer on the static lane's thread, the first
    time only (``streams/lazy.py``); ``crash`` is what a lane does with a failure
    that is not a pair's (it must not return: see ``streams/exits.py``); ``backoff``
    is how a score the broker refused is sent again (``streams/delivery.py``).
    """

    def __init__(
        self,
        topics: Topics,
        *,
        embedder: Callable[[], Embedder | None],
        policy: Policy,
        signer: CommandSigner,
        dead_letters: DeadLetterSink,
        stats: WorkerStats,
        crash: Callable[[str, int], NoReturn],
        clock: Callable[[], float] = time.time,
        failpoint: Failpoint = no_failpoint,
        prompt_salt: str = "",
        backoff: Backoff | None = None,
    ) -> None:
        self._topics = topics
        self._embedder = embedder
        self._policy = policy
        self._signer = signer
        self._dead_letters = dead_letters
        self._stats = stats
        self._clock = clock
        self._failpoint = failpoint
        self._prompt_salt = prompt_salt
        # One thread for the embedder: torch releases the GIL, the event loop keeps
        # heartbeating while a batch is embedded.
        self._static_lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantdrift-embed")
        # The escalation lane's own thread: MiniLM on the pairs the static tier cannot
        # settle, off the path of those it can (streams/lanes.py says why and what it keeps).
        self.lanes = ScoreLanes(
            stage=self.stage,
            finish=self.finish,
            alone=self.alone,
            emit=self.emit,
            crash=crash,
            static_lane=self._static_lane,
            escalation_lane=ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="quantdrift-escalate"
            ),
            backoff=backoff if backoff is not None else Backoff(),
        )

    @property
    def in_flight(self) -> int:
        """Pairs taken and not yet released (their records are not acknowledged)."""
        return self.lanes.in_flight

    async def warm(self) -> None:
        """Load the model before the first batch, not during it (a ~5 s stall)."""
        await asyncio.get_running_loop().run_in_executor(self._static_lane, self._embedder)

    async def handle(self, events: Sequence[Any]) -> None:
        """Score a batch: bad records to the DLQ, the pairs through the two lanes.

        Each pair's record gets one more reference before the batch is handed on,
        dropped only once its score (or dead letter) is sent: ``take_events``
        acknowledges the batch when this returns, and the offset of a pair still
        waiting on the escalation lane must not be committed then.
        """
        held: list[Held] = []
        for event in events:
            pairs, dead = parse_batch([RawRecord.of_event(event)], self._clock(), self._prompt_salt)
            await self._dead_letters.send(dead)
            for pair in pairs:
                event.message.incref()
                held.append(Held(pair, event.ack))
        await self.lanes.submit(held)

    def stage(self, pairs: list[PairEvent]) -> StagedScores:
        """The static lane's step: final scores of the pairs that need no escalation."""
        for p in pairs:
            self._failpoint(f"score:{p.pair_id}")
        started = time.perf_counter()
        ready, staged = stage_batch(self._embedder(), pairs, self._policy.thresholds)
        stats = self._stats
        stats.scoring_seconds.append((time.perf_counter() - started) / len(pairs))
        del stats.scoring_seconds[:-2048]
        stats.batches += 1
        return StagedScores(ready, tuple(staged.waiting), staged)

    def finish(self, waiting: list[Waiting]) -> list[ScoreEvent]:
        """The escalation lane's step: the full model on a few waiting pairs, one call."""
        self._failpoint("escalate")
        units: list[tuple[Staged, int]] = []
        for w in waiting:
            if not isinstance(w.staged.token, Staged):
                raise TypeError("a pair waiting on the escalation lane was not staged by stage()")
            units.append((w.staged.token, w.index))
        return finish_batch(self._embedder(), units, self._policy.thresholds)

    def alone(self, pair: PairEvent) -> ScoreEvent:
        """One pair scored whole, both tiers (a batch's step raised: find who did)."""
        self._failpoint(f"score:{pair.pair_id}")
        (score,) = score_batch(self._embedder(), [pair], self._policy.thresholds)
        return score

    def emit(self, pair: PairEvent, outcome: ScoreEvent | Exception) -> Send:
        """What sends a pair's signed score, or dead-letters it with why scoring failed.

        Sealed once: every attempt the lanes make sends the same bytes, so a resend
        is the same score, which the judge drops if it already folded the pair.
        """
        if isinstance(outcome, Exception):
            self._stats.scoring_failures += 1
            letter = DeadLetter.of(
                pair.dumps(),
                topic=self._topics.pairs.get_topic_name(),
                key=pair.route,
                error=f"scoring failed: {type(outcome).__name__}: {outcome}",
                now=self._clock(),
            )
            return self._dead_letters.sender(letter)
        self._failpoint("send_score")
        key, value = pair.route.encode(), self._signer.seal_score(outcome, self._clock())
        self._stats.pairs_scored += 1
        scores = self._topics.scores

        async def send() -> Awaitable[object]:
            return await scores.send(key=key, value=value)

        return send
