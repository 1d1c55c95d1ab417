"""Pairs to ScoreEvents: the one path the worker, replay, eval and calibrate score through.

:func:`score_batch` is the whole of it: every pair's metrics from the scorer
(:func:`~quantdrift.embedding.factory.score_with`, so a tiered scorer escalates as
it does live), then each pair's ScoreEvent with its route's verdict thresholds
(:func:`score_events`). The worker runs the same two halves a batch at a time on
its two lanes (:func:`stage_batch`, then :func:`finish_batch` for the pairs the
static tier escalated); ``score_batch`` is those two calls in a row, so a pair
gets the same ScoreEvent whichever path scored it, and replaying a live run
reproduces its scores. Eval scores a pair once and rebuilds its ScoreEvent under
each policy it compares: it keeps the metrics (``evaluation/cache.py``) and calls
:func:`score_events`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from quantdrift.detectors.semantic import Embedder
from quantdrift.detectors.suite import FailureThresholds, score_event
from quantdrift.embedding.factory import finish_pair_scores, score_with, stage_scores
from quantdrift.embedding.tiered import Staged
from quantdrift.schemas.pair import PairEvent
from quantdrift.schemas.score import Metrics, ScoreEvent

Thresholds = Callable[[str], FailureThresholds]
"""A route's per-pair verdict thresholds, by route (``Policy.thresholds``)."""


def score_events(
    pairs: Sequence[PairEvent],
    metrics: Sequence[Metrics],
    thresholds: Thresholds,
    route: str | None = None,
) -> list[ScoreEvent]:
    """Each scored pair's ScoreEvent, with the verdict under its route's thresholds.

    ``route`` publishes every pair as that route's (eval replays one recording on
    several routes); its thresholds are then the ones asked for. ``thresholds`` is
    asked once per route of the batch (a policy override is validated on each call).
    """
    by_route: dict[str, FailureThresholds] = {}
    events = []
    for p, m in zip(pairs, metrics, strict=True):
        name = route or p.route
        found = by_route.get(name)
        if found is None:
            found = by_route[name] = thresholds(name)
        events.append(score_event(p, m, found, route))
    return events


def score_batch(
    scorer: Embedder | None,
    pairs: Sequence[PairEvent],
    thresholds: Thresholds,
    route: str | None = None,
) -> list[ScoreEvent]:
    """Every pair's ScoreEvent, in order, the scorer called once per tier for the batch."""
    return score_events(pairs, score_with(scorer, pairs), thresholds, route)


def stage_batch(
    scorer: Embedder | None, pairs: Sequence[PairEvent], thresholds: Thresholds
) -> tuple[dict[int, ScoreEvent], Staged]:
    """The cheap half of :func:`score_batch`: the final ScoreEvent of every pair that
    needs no escalation, by index, and the scorer's record of the rest (its ``waiting``)."""
    staged = stage_scores(scorer, pairs)
    ready = list(staged.ready.items())
    events = score_events([pairs[i] for i, _ in ready], [m for _, m in ready], thresholds)
    return {i: e for (i, _), e in zip(ready, events, strict=True)}, staged


def finish_batch(
    scorer: Embedder | None, units: Sequence[tuple[Staged, int]], thresholds: Thresholds
) -> list[ScoreEvent]:
    """The expensive half: ScoreEvents of some waiting pairs, ``(staged batch, index)``,
    the full model called once for them."""
    metrics = finish_pair_scores(scorer, units)
    return score_events([staged.pairs[i] for staged, i in units], metrics, thresholds)
