"""The route's policy is applied to a pair in the judge alone: the verdict a score
carries on the wire (the scoring worker's reading) never decides anything.

Scores here come from the real scoring path (``embedding.batch.score_batch``) under one
policy and are folded under another, as when a worker with an older policy file scored
them, or a recorded scores topic is replayed under a new policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from quantdrift.breaker.offline import StreamFold, offline_store
from quantdrift.breaker.policy import Policy, RoutePolicy
from quantdrift.breaker.rules.reading import read
from quantdrift.detectors.suite import hard_failures
from quantdrift.embedding.batch import score_batch
from quantdrift.schemas import ModelOutput, PairEvent, ScoreEvent

ROUTE = "cs/int4"
SEEDS = RoutePolicy(rules=("consecutive",), min_pairs=3, consecutive_failures=3)
STRICT = Policy(default=SEEDS.model_copy(update={"similarity_threshold": 0.9}))
LENIENT = Policy(default=SEEDS.model_copy(update={"similarity_threshold": 0.1}))


class HalfWay:
    """Every candidate embeds at cosine 0.5 from its reference."""

    tier = "minilm"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = [[0.5, 0.75**0.5] if t.startswith("cand") else [1.0, 0.0] for t in texts]
        return np.asarray(rows, dtype=np.float32)


def pairs(n: int) -> list[PairEvent]:
    """Greedy pairs at cosine 0.5: drift under a 0.9 bar, fine under a 0.1 bar."""
    return [
        PairEvent(
            pair_id=f"p{i}",
            route=ROUTE,
            ts=float(i),
            candidate=ModelOutput(text=f"cand alpha beta gamma {i}"),
            reference=ModelOutput(text=f"ref alpha beta omega {i}"),
            request={"temperature": 0.0},
        )
        for i in range(n)
    ]


def rollbacks(scores: list[ScoreEvent], policy: Policy) -> list[str]:
    async def fold() -> list[str]:
        stream = StreamFold(offline_store(), policy)
        found = []
        for score in scores:
            found += [t.transition.to_state for t in await stream.fold(score, score.ts)]
        return found

    return asyncio.run(fold())


def test_the_judges_policy_decides_whatever_the_scorer_wrote() -> None:
    lenient_scores = score_batch(HalfWay(), pairs(5), LENIENT.thresholds)
    strict_scores = score_batch(HalfWay(), pairs(5), STRICT.thresholds)
    # The wire says ok under the lenient policy and drift under the strict one ...
    assert {s.verdict for s in lenient_scores} == {"ok"}
    assert {s.verdict for s in strict_scores} == {"drift"}
    # ... and the same scores fold by the judge's policy, not by what they carry.
    assert rollbacks(lenient_scores, STRICT) == ["open"]
    assert rollbacks(strict_scores, LENIENT) == []


def test_the_judges_reading_holds_the_verdict_and_the_hard_failure() -> None:
    (score,) = score_batch(HalfWay(), pairs(1), LENIENT.thresholds)
    looping = score.model_copy(
        update={"metrics": score.metrics.model_copy(update={"repetition_run": 9})}
    )
    strict = read(STRICT.for_route(ROUTE), looping, None)
    assert strict.verdict == "anomaly" and strict.failing and strict.hard
    assert strict.reasons == (*hard_failures(looping.metrics), "cosine 0.50 < 0.9")
    lenient = read(LENIENT.for_route(ROUTE), score, None)
    assert (lenient.verdict, lenient.failing, lenient.hard) == ("ok", False, False)
