"""The noise floor's seed values per decoding mode: noise pairs and a blessed baseline.

Shared by ``quantdrift calibrate`` (which writes them to Redis) and
``quantdrift eval`` (which seeds its in-memory store), so both start from
the same floor.

* **Noise pairs** (``kind = noise``, reference vs reference) of each mode feed
  that mode's floor, and only that mode's: a greedy floor is never built from
  sampled pairs (two sampled runs disagree far more than a greedy candidate and
  its reference, so a sampled floor would hide greedy drift). Identical noise
  pairs (two greedy runs that agree token for token) say nothing about how much
  disagreement is normal and are left out.
* **Blessed pairs**: shadow pairs of a candidate the operator approved (a
  baseline run). Their values go to the floor under ``blessed:<metric>``; the
  tolerance rule uses them for a metric whose noise floor is degenerate (greedy
  runs; teacher-forced KL of the reference against itself, ~1e-5 nats). Each
  blessed pair also gives its paired outcome under ``blessed:outcomes`` and its hard
  failure (0 or 1, by the route's thresholds) under ``blessed:hard``: those tests'
  nulls are then the blessed candidate's rates plus δ.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quantdrift.breaker.policy import RoutePolicy, failure_thresholds
from quantdrift.breaker.step import is_echo
from quantdrift.detectors.noise_floor import metric_values
from quantdrift.detectors.suite import DEFAULT_THRESHOLDS, FailureThresholds
from quantdrift.detectors.tolerance import (
    BLESSED,
    BLESSED_HARD,
    BLESSED_OUTCOMES,
    hard_x,
    outcome_x,
)
from quantdrift.evaluation.cache import ScoreCache, to_score
from quantdrift.schemas import PairEvent
from quantdrift.schemas.score import ScoreEvent

MODES = ("greedy", "sampled")


def floor_seed(
    scores: Iterable[ScoreEvent],
    min_pairs: int = 30,
    blessed: Iterable[ScoreEvent] = (),
    thresholds: FailureThresholds = DEFAULT_THRESHOLDS,
) -> tuple[dict[str, list[dict[str, float]]], dict[str, str]]:
    """``({mode: [metric values per pair]}, {mode: where its values came from})``.

    Only ``kind == "noise"`` scores of ``scores`` count, each in its own mode;
    every score of ``blessed`` adds its values under ``blessed:`` keys to its
    mode. ``min_pairs`` is only reported against (the judge decides per metric
    whether a floor is informative enough to use). ``thresholds`` say what a hard
    failure is (the route policy's, as its judge counts them).

    Examples
    --------
    >>> from quantdrift.schemas import Metrics
    >>> s = lambda i, mode, c, kind="noise": ScoreEvent(pair_id=str(i), route="r", kind=kind,
    ...     ts=0, decoding=mode, metrics=Metrics(cosine=c, first_divergence=0, candidate_tokens=3))
    >>> seed, source = floor_seed([s(i, "sampled", 0.9) for i in range(3)], min_pairs=2,
    ...     blessed=[s(9, "greedy", 0.97, "shadow")])
    >>> seed["greedy"], source["greedy"]  # doctest: +NORMALIZE_WHITESPACE
    ([{'blessed:cosine': 0.97, 'blessed:outcomes': 0.5, 'blessed:hard': 0.0}],
     'no informative greedy noise pairs; 1 blessed pairs')
    """
    own: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for score in scores:
        if score.kind != "noise" or is_echo(score):
            continue
        values = metric_values(score.metrics)
        if values:
            own[score.decoding].append(values)
    blessed_rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for score in blessed:
        values = metric_values(score.metrics)
        # Every blessed pair has an outcome and a hard-failure x (those tests' baselines).
        row = {BLESSED + k: v for k, v in values.items()}
        row[BLESSED_OUTCOMES] = outcome_x(score.metrics)
        row[BLESSED_HARD] = hard_x(score.metrics, thresholds)
        blessed_rows[score.decoding].append(row)
    seed: dict[str, list[dict[str, float]]] = {}
    source: dict[str, str] = {}
    for mode in MODES:
        n, b = len(own[mode]), len(blessed_rows[mode])
        noise = (
            f"{n} {mode} noise pairs" + (f" (fewer than {min_pairs})" if 0 < n < min_pairs else "")
            if n
            else f"no informative {mode} noise pairs"
        )
        source[mode] = noise + (f"; {b} blessed pairs" if b else "")
        seed[mode] = own[mode] + blessed_rows[mode]
    return seed, source


def seed_from_pairs(
    noise: Sequence[PairEvent],
    blessed: Sequence[PairEvent],
    cache: ScoreCache,
    policy: RoutePolicy,
    route: str,
) -> tuple[dict[str, list[dict[str, float]]], dict[str, str]]:
    """:func:`floor_seed` of recorded pairs, each scored (from ``cache``) as ``route``'s
    worker scores it: what ``quantdrift calibrate`` writes and eval seeds its store with."""
    return floor_seed(
        [to_score(p, cache[p], policy, route) for p in noise],
        policy.min_noise_pairs,
        [to_score(p, cache[p], policy, route) for p in blessed],
        failure_thresholds(policy),
    )
