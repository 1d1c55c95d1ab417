"""One ``score_batch``: the worker's two lanes, replay and eval give a pair the same
ScoreEvent under the same policy, escalated or not, on any route. No model, no broker."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NoReturn

import numpy as np

from quantdrift.breaker.policy import Policy
from quantdrift.embedding.batch import score_batch
from quantdrift.embedding.static import Calibration
from quantdrift.embedding.tiered import Escalation, TieredScorer
from quantdrift.evaluation.cache import ScoreCache, to_score
from quantdrift.replay.core import rescore
from quantdrift.schemas import CommandSigner, ModelOutput, PairEvent
from quantdrift.streams.lanes import Waiting
from quantdrift.streams.score_stage import ScoreStage
from quantdrift.streams.stats import WorkerStats

# Route "strict" judges similarity at 0.95: the same metrics give another verdict there.
POLICY = Policy(routes={"strict": {"similarity_threshold": 0.95}})


class Cosines:
    """``cand:<cos>:…`` embeds at that cosine from ``ref:…``; the full model sits a bit lower."""

    def __init__(self, tier: str, shift: float = 0.0) -> None:
        self.tier, self.shift = tier, shift

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for t in texts:
            c = float(t.split(":")[1]) - self.shift if t.startswith("cand:") else 1.0
            rows.append([c, math.sqrt(max(0.0, 1 - c * c))])
        return np.asarray(rows, dtype=np.float32)


def tiered() -> TieredScorer:
    escalation = Escalation(thresholds=(0.88, 0.95), sample_rate=0.0, rate=None)
    return TieredScorer(
        Cosines("static"), Cosines("minilm", 0.01), Calibration(band=0.02), escalation
    )


def pairs() -> list[PairEvent]:
    cosines = [0.99, 0.955, 0.93, 0.881, 0.5]  # 0.955 and 0.881 sit on a bar: they escalate
    return [
        PairEvent(
            pair_id=f"p{i}-{route}",
            route=route,
            ts=1.0,
            candidate=ModelOutput(text=f"cand:{c}:{i}"),
            reference=ModelOutput(text=f"ref:{i}"),
        )
        for route in ("lenient", "strict")
        for i, c in enumerate(cosines)
    ]


def crash(what: str, n: int) -> NoReturn:
    raise AssertionError(f"{what} crashed with {n} pairs in flight")


def worker_scores(batch: list[PairEvent]) -> dict[str, object]:
    """What the score stage's lane steps produce: staged, then the escalated pairs finished."""
    scorer = tiered()
    stage = ScoreStage(
        None,  # type: ignore[arg-type]  # the lane steps send nothing
        embedder=lambda: scorer,
        policy=POLICY,
        signer=CommandSigner("k", b"score-batch-test-key"),
        dead_letters=None,  # type: ignore[arg-type]
        stats=WorkerStats(),
        crash=crash,
    )
    staged = stage.stage(batch)
    assert staged.waiting, "no pair escalated: the comparison would miss the full model"
    finished = stage.finish([Waiting(staged, i) for i in staged.waiting])
    events = {**staged.ready, **dict(zip(staged.waiting, finished, strict=True))}
    alone = stage.alone(batch[1])
    assert alone == events[1]
    return {e.pair_id: e.model_dump() for e in events.values()}


def test_worker_replay_and_eval_score_a_pair_alike() -> None:
    batch = pairs()
    worker = worker_scores(batch)
    replay = {e.pair_id: e.model_dump() for e in rescore(batch, tiered(), POLICY)}
    whole = {e.pair_id: e.model_dump() for e in score_batch(tiered(), batch, POLICY.thresholds)}
    cache = ScoreCache(tiered())
    cache.fill(batch)
    evaluation = {
        p.pair_id: to_score(p, cache[p], POLICY.for_route(p.route)).model_dump() for p in batch
    }
    assert worker == replay == whole == evaluation
    verdicts = {pid: e["verdict"] for pid, e in worker.items()}  # type: ignore[index]
    assert verdicts["p2-lenient"] == "ok" and verdicts["p2-strict"] == "drift"
    tiers = {e["metrics"]["cosine_tier"] for e in worker.values()}  # type: ignore[index]
    assert tiers == {"static", "minilm"}


def test_eval_on_another_route_takes_that_routes_thresholds() -> None:
    (pair,) = [p for p in pairs() if p.pair_id == "p2-lenient"]
    (moved,) = score_batch(tiered(), [pair], POLICY.thresholds, route="strict")
    assert (moved.route, moved.verdict) == ("strict", "drift")
