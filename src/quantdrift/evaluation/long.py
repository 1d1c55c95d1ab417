"""Long seeded streams: false rollbacks per 100k healthy pairs and detection delays.

``quantdrift eval --streams K --length N --seed S``: each of the K streams is N
healthy shadow pairs drawn with replacement from the healthy pool (its own
seeded generator), then ``drift_length`` pairs drawn from the drifted pool. A
fresh in-memory store per stream and policy, seeded with the floor; the decision
is the production one, reached through the breaker's store protocol
(:class:`~quantdrift.breaker.offline.StreamFold`, as replay and the per-route
eval reach it), fed one pair per simulated ``pair_interval_s``. Each draw is a
pair of its own (its id names the stream and the draw), so a pair drawn twice
folds twice rather than being dropped as a redelivery.

Counted per policy:

* ``false_rollbacks``: closed -> open transitions during the healthy parts;
  ``false_rollbacks_per_100k`` and the exact Poisson 95 % upper bound
  (``chi2.ppf(0.95, 2k + 2) / 2`` events over the healthy pairs): 0 of 100,000
  still allows up to 3.0 per 100k.
* ``detection_delay_pairs`` (median over the streams that caught the drift) and
  ``detection_delay_p90``: drifted pairs judged up to and including the one that
  opened the route (0: already open at the onset, after a false rollback).
* ``information_limit_pairs``: what an oracle fitted on these very pairs would need
  on average (``evaluation/limit.py``): the bound a delay is read against.
* ``missed``: streams whose drift was never caught within ``drift_length``.
  Delays of missed streams count as ``drift_length + 1`` in the quantiles, so a
  miss never makes a policy look faster.

Several calibrations (``floor_rows`` a sequence, one floor per draw): every draw
judges the same K streams from its own floor, and the counts and delays above are
over all draws' streams (``streams`` = draws x K), so the false-rollback rate pays
for how much the floor and blessed baseline move with the calibration pairs.

Scores are built once per distinct pair and policy: a long stream costs judging,
not scoring (metrics come from the content-keyed :class:`ScoreCache`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import chi2

from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.offline import StreamFold, offline_store
from quantdrift.breaker.policy import Policy
from quantdrift.breaker.state import Transition
from quantdrift.detectors.noise_floor import NoiseFloor
from quantdrift.evaluation.cache import ScoreCache, to_score
from quantdrift.evaluation.limit import information_limit
from quantdrift.evaluation.table import text_table
from quantdrift.schemas import PairEvent, ScoreEvent

ROUTE = "eval/long"

# One floor's seed values: decoding mode -> the metric values of each seeding pair.
FloorRows = Mapping[str, Sequence[dict[str, float]]]


@dataclass
class LongResult:
    """One JSON line of ``quantdrift eval --streams``."""

    policy: str
    streams: int
    healthy_pairs: int
    false_rollbacks: int
    false_rollbacks_per_100k: float
    false_rollbacks_per_100k_upper95: float
    detection_delay_pairs: float | None
    detection_delay_p90: float | None
    missed: int
    drifted: str = ""
    drifted_pairs_per_stream: int = 0
    streams_with_false_rollback: int = 0
    detected_by: dict[str, int] = field(default_factory=dict)
    false_rollback_rules: dict[str, int] = field(default_factory=dict)
    floor: dict[str, str] = field(default_factory=dict)
    # An oracle's expected pairs to flag this pool (evaluation/limit.py): the delay's bound.
    information_limit_pairs: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def poisson_upper95(k: int, exposure: float, per: float = 1e5) -> float:
    """Exact one-sided 95 % upper bound of a Poisson rate, per ``per`` units.

    >>> round(poisson_upper95(0, 100_000), 2)
    3.0
    """
    if exposure <= 0:
        return float("inf")
    return float(chi2.ppf(0.95, 2 * k + 2) / 2.0) / exposure * per


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.quantile(np.asarray(values, dtype=float), q, method="higher"))


def run_long(
    healthy: Sequence[PairEvent],
    drifted: Mapping[str, Sequence[PairEvent]] | Sequence[PairEvent],
    floor_rows: FloorRows | Sequence[FloorRows],
    cache: ScoreCache,
    policies: Mapping[str, Policy],
    *,
    streams: int,
    length: int,
    seed: int,
    drift_length: int = 200,
    pair_interval_s: float = 1.0,
    noise_floor: NoiseFloor | None = None,
    floor_source: Mapping[str, str] | None = None,
) -> list[LongResult]:
    """One :class:`LongResult` per policy and drifted pool.

    ``drifted``: one pool, or several by name (``{"int4": [...], "int2": [...]}``).
    The healthy part of each stream is judged once per policy; every pool's drift
    then starts from a fork of that same store, so three pools cost one healthy
    pass, and their false-rollback counts are the same streams. ``floor_rows`` maps
    a decoding mode to the metric values that seed its floor
    (:func:`~quantdrift.evaluation.calibration.floor_seed`), written as
    ``quantdrift calibrate`` writes them: through the store; a sequence of them is
    one floor per calibration draw, each judging the same streams.
    """
    floors = [floor_rows] if isinstance(floor_rows, Mapping) else list(floor_rows)
    if not floors:
        raise ValueError("at least one floor (calibration draw)")
    if streams < 1 or length < 0 or drift_length < 0:
        raise ValueError("streams >= 1, length >= 0, drift_length >= 0")
    if not healthy:
        raise ValueError("no healthy shadow pairs to resample")
    pools = dict(drifted) if isinstance(drifted, Mapping) else {"drifted": list(drifted)}
    pools = {name: list(p) for name, p in pools.items() if p} or {"": []}
    cache.fill([*healthy, *(p for pool in pools.values() for p in pool)])
    nf = noise_floor or NoiseFloor()
    # The same draws for every policy: policies differ by their decisions only.
    draws = _stream_draws(len(healthy), pools, streams, length, drift_length, seed)
    results = []
    limits: dict[str, float | None] = {}
    for name, policy in policies.items():
        rp = policy.for_route(ROUTE)
        h_scores = [to_score(p, cache[p], rp, ROUTE) for p in healthy]
        d_scores = {
            pool: [to_score(p, cache[p], rp, ROUTE) for p in pairs] for pool, pairs in pools.items()
        }
        if not limits:  # once: metrics do not depend on the policy
            h_rows = [s.metrics.model_dump() for s in h_scores]
            limits = {
                pool: information_limit(h_rows, [s.metrics.model_dump() for s in scores])
                for pool, scores in d_scores.items()
            }
        seeds = [_seeded(rows_by_mode, nf) for rows_by_mode in floors]
        false, with_false = 0, 0
        false_rules: Counter[str] = Counter()
        delays: dict[str, list[float]] = {pool: [] for pool in pools}
        missed: Counter[str] = Counter()
        by: dict[str, Counter[str]] = {pool: Counter() for pool in pools}
        for seeded in seeds:
            for k, (h, d) in enumerate(draws):
                fold = StreamFold(seeded.fork(), policy)
                rules_fired, now = asyncio.run(
                    _healthy_part(fold, _drawn(h_scores, h, f"{k}:"), pair_interval_s)
                )
                false += len(rules_fired)
                with_false += bool(rules_fired)
                false_rules.update(rules_fired)
                for pool, idx in d.items():
                    if not len(idx):
                        continue
                    delay, rule = asyncio.run(
                        _drift_part(
                            forked(fold),
                            _drawn(d_scores[pool], idx, f"{k}:{pool}:"),
                            pair_interval_s,
                            now,
                        )
                    )
                    if delay is None:
                        missed[pool] += 1
                        delays[pool].append(float(drift_length + 1))
                    else:
                        delays[pool].append(float(delay))
                        by[pool][rule or "?"] += 1
        total = len(seeds) * streams * length
        tally = _Tally(false, with_false, false_rules, delays, missed, by)
        results += tally.results(name, pools, len(seeds) * streams, total, drift_length, limits,
                                 floor_source)  # fmt: skip
    return results


def _stream_draws(
    n_healthy: int,
    pools: Mapping[str, Sequence[PairEvent]],
    streams: int,
    length: int,
    drift_length: int,
    seed: int,
) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Each stream's seeded draw: healthy indices, then each pool's drift indices."""
    draws = []
    for k in range(streams):
        rng = np.random.default_rng([seed, k])
        h = rng.integers(0, n_healthy, size=length)
        d = {
            name: rng.integers(0, len(pool), size=drift_length) if pool else np.zeros(0, int)
            for name, pool in pools.items()
        }
        draws.append((h, d))
    return draws


def _seeded(rows_by_mode: FloorRows, nf: NoiseFloor) -> MemoryBreakerStore:
    """A store whose floors are one calibration draw's, written as calibrate writes them."""
    seeded = offline_store(nf)
    for mode, rows in rows_by_mode.items():
        asyncio.run(seeded.seed_floor(ROUTE, mode, list(rows)))
    return seeded


@dataclass
class _Tally:
    """What one policy's streams counted: false rollbacks, and per pool its delays."""

    false: int
    with_false: int
    false_rules: Counter[str]
    delays: dict[str, list[float]]
    missed: Counter[str]
    by: dict[str, Counter[str]]

    def results(
        self,
        name: str,
        pools: Mapping[str, Sequence[PairEvent]],
        streams: int,
        total: int,
        drift_length: int,
        limits: Mapping[str, float | None],
        floor_source: Mapping[str, str] | None,
    ) -> list[LongResult]:
        out = []
        for pool, pairs in pools.items():
            caught = [x for x in self.delays[pool] if x <= drift_length]
            out.append(
                LongResult(
                    policy=name,
                    streams=streams,
                    healthy_pairs=total,
                    false_rollbacks=self.false,
                    false_rollbacks_per_100k=round(1e5 * self.false / total, 3) if total else 0.0,
                    false_rollbacks_per_100k_upper95=round(poisson_upper95(self.false, total), 3),
                    detection_delay_pairs=quantile(caught, 0.5) if pairs else None,
                    detection_delay_p90=quantile(self.delays[pool], 0.9) if pairs else None,
                    missed=self.missed[pool],
                    drifted=pool,
                    drifted_pairs_per_stream=drift_length if pairs else 0,
                    streams_with_false_rollback=self.with_false,
                    detected_by=dict(self.by[pool]),
                    false_rollback_rules=dict(self.false_rules),
                    floor=dict(floor_source or {}),
                    information_limit_pairs=_rounded(limits.get(pool)),
                )
            )
        return out


def _rounded(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else round(x, 1)


def _drawn(scores: Sequence[ScoreEvent], idx: Iterable[int], prefix: str) -> list[ScoreEvent]:
    """The drawn scores, each a pair of its own: ``prefix`` + its place in the draw."""
    return [scores[i].model_copy(update={"pair_id": f"{prefix}{n}"}) for n, i in enumerate(idx)]


def forked(fold: StreamFold) -> StreamFold:
    """The same stream from here on, folding into a copy of its store."""
    assert isinstance(fold.store, MemoryBreakerStore)
    return StreamFold(fold.store.fork(), fold.policy, dict(fold.shadow_pairs))


async def _healthy_part(
    fold: StreamFold, healthy: Sequence[ScoreEvent], interval: float
) -> tuple[list[str], float]:
    """Judge the healthy pairs; the false rollbacks' rules and the clock at the onset."""
    now, timed = 0.0, []
    for score in healthy:
        now += interval
        timed.append((now, score))
    trips = await fold.fold_all(timed)
    return [t.transition.rule for t in trips if _opens(t.transition, from_closed=True)], now


async def _drift_part(
    fold: StreamFold, drifted: Sequence[ScoreEvent], interval: float, now: float
) -> tuple[int | None, str | None]:
    """(drifted pairs up to and including the one that opened the route, its rule)."""
    if (await fold.state(ROUTE)).state != "closed":
        return 0, "open at onset"
    for i, score in enumerate(drifted, start=1):
        now += interval
        for trip in await fold.fold(score, now):
            if _opens(trip.transition):
                return i, trip.transition.rule
    return None, None


def _opens(t: Transition, from_closed: bool = False) -> bool:
    return t.to_state == "open" and (not from_closed or t.from_state == "closed")


# (header, LongResult field) per column of the table.
LONG_COLUMNS = (
    ("policy", "policy"),
    ("drifted", "drifted"),
    ("streams", "streams"),
    ("healthy", "healthy_pairs"),
    ("false", "false_rollbacks"),
    ("per 100k", "false_rollbacks_per_100k"),
    ("upper95", "false_rollbacks_per_100k_upper95"),
    ("delay", "detection_delay_pairs"),
    ("p90", "detection_delay_p90"),
    ("missed", "missed"),
    ("limit", "information_limit_pairs"),
)


def cell(x: object) -> str:
    """``-`` for nothing (no value, no pool name), floats as ``%g``."""
    if x is None or x == "":
        return "-"
    return f"{x:g}" if isinstance(x, float) else str(x)


def format_long(results: Sequence[LongResult]) -> str:
    """A plain-text table, one row per policy."""
    rows = [[cell(getattr(r, name)) for _, name in LONG_COLUMNS] for r in results]
    return text_table([header for header, _ in LONG_COLUMNS], rows)
