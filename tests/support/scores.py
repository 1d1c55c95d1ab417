"""Scores as the worker signs them, for tests of the breaker's fold: pair ``i`` of route
``r``, healthy (``ok``) or drifted, with the metrics and verdict a real score carries."""

from __future__ import annotations

from quantdrift.schemas import Metrics, ScoreEvent


def score(
    i: int,
    ok: bool = True,
    kind: str = "shadow",
    pair: str | None = None,
    engine: str | None = None,
) -> ScoreEvent:
    """Pair ``i`` (id ``pair`` or ``p{i}``) at ``ts = i``, greedy, from ``engine``."""
    return ScoreEvent(
        pair_id=pair or f"p{i}",
        route="r",
        kind=kind,  # type: ignore[arg-type]
        ts=float(i),
        decoding="greedy",
        metrics=Metrics(cosine=0.99 if ok else 0.2, rougeL=0.9 if ok else 0.1),
        verdict="ok" if ok else "drift",
        reasons=[] if ok else ["cosine 0.20 < 0.88"],
        candidate_engine=engine,
    )
