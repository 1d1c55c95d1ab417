"""Re-score pairs and fold them through an in-memory breaker: no I/O, no side effects.

``rescore`` turns pairs into ScoreEvents the way the score agent does (through
``embedding.batch.score_batch``, the worker's own path, so a tiered scorer escalates
as it does live);
``build_report`` folds scores through the breaker's in-memory store under a
policy (:class:`~quantdrift.breaker.offline.StreamFold`, the driver eval shares)
and returns plain numbers: trips per rule, false rollbacks against labels,
per-metric quantiles for shadow and noise pairs, the worst pairs. Rendering
(HTML, CSV, Parquet) lives in ``render.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from quantdrift.breaker.machine import similarity_of
from quantdrift.breaker.offline import StreamFold, offline_store
from quantdrift.breaker.policy import Policy
from quantdrift.detectors import Embedder
from quantdrift.embedding.batch import score_batch
from quantdrift.schemas import PairEvent, ScoreEvent

# Labels the lab and the demo give pairs that are known not to have drifted.
HEALTHY_LABELS = frozenset({"int8", "noise", "healthy"})
# Metrics the report summarizes (numbers; booleans and token counts are left out).
REPORT_METRICS = ("cosine", "rougeL", "rouge1", "bleu", "jaccard", "entropy_mean", "kl", "tf_gap")
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def rescore(
    pairs: Sequence[PairEvent], embedder: Embedder | None, policy: Policy
) -> list[ScoreEvent]:
    """ScoreEvents for one batch of pairs, as the score agent would publish them."""
    return score_batch(embedder, pairs, policy.thresholds)


def rescore_stream(
    pairs: Iterable[PairEvent],
    embedder: Embedder | None,
    policy: Policy,
    batch: int = 64,
    progress: Callable[[int], None] | None = None,
) -> list[ScoreEvent]:
    """Scores for every pair in order, ``batch`` pairs per embedder call."""
    scores: list[ScoreEvent] = []
    chunk: list[PairEvent] = []
    for pair in pairs:
        chunk.append(pair)
        if len(chunk) >= batch:
            scores.extend(rescore(chunk, embedder, policy))
            if progress:
                progress(len(chunk))
            chunk = []
    if chunk:
        scores.extend(rescore(chunk, embedder, policy))
        if progress:
            progress(len(chunk))
    return scores


@dataclass(frozen=True, slots=True)
class TripRow:
    """One breaker transition: ``index`` counts the route's shadow pairs (a :class:`Trip`'s)."""

    route: str
    index: int
    stream_index: int
    pair_id: str
    rule: str
    from_state: str
    to_state: str
    reason: str
    epoch: int
    false_rollback: bool | None  # None: no labels to judge by


@dataclass
class RouteReport:
    route: str
    shadow_pairs: int = 0
    noise_pairs: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    trips: list[TripRow] = field(default_factory=list)
    # rule -> shadow-pair indices where that rule alone would have fired
    rule_fires: dict[str, list[int]] = field(default_factory=dict)
    false_rollbacks: int = 0
    labelled_rollbacks: int = 0
    quantiles: dict[str, dict[str, list[float] | None]] = field(default_factory=dict)
    worst: list[dict[str, object]] = field(default_factory=list)
    # (route shadow index, similarity) for the plot; trips mark indices on it
    similarity: list[tuple[int, float]] = field(default_factory=list)
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)


@dataclass
class ReplayReport:
    routes: dict[str, RouteReport]
    total_scores: int
    policy: Policy
    source: str = ""

    @property
    def trips(self) -> list[TripRow]:
        return [t for r in self.routes.values() for t in r.trips]


def quantiles(values: Sequence[float], qs: Sequence[float] = QUANTILES) -> list[float] | None:
    """Linear-interpolated quantiles (numpy's default); None for no values.

    >>> quantiles([1.0, 2.0, 3.0, 4.0, 5.0], (0.0, 0.5, 1.0))
    [1.0, 3.0, 5.0]
    """
    if not values:
        return None
    s = sorted(values)
    out = []
    for q in qs:
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        out.append(s[lo] + (s[hi] - s[lo]) * (pos - lo))
    return out


def _is_rollback(to_state: str, rule: str) -> bool:
    return to_state == "open" and rule != "manual"


def _false_rollback(labels: Sequence[str | None], recent: int) -> bool | None:
    """A trip is false when the recent labelled shadow pairs are all healthy."""
    known = [label for label in labels[-recent:] if label is not None]
    if not known:
        return None
    return all(label in HEALTHY_LABELS for label in known)


def build_report(
    scores: Sequence[ScoreEvent],
    policy: Policy,
    *,
    worst_n: int = 10,
    recent_labels: int | None = None,
    per_rule: bool = True,
    source: str = "",
) -> ReplayReport:
    """Fold scores in order through an in-memory store (time = each score's ``ts``).

    ``recent_labels`` is how many shadow pairs before a trip decide whether it
    was a false rollback (default: the route's K consecutive failures).
    ``per_rule`` also runs one store per rule, to show when each rule
    alone would have fired.
    """
    return asyncio.run(_build_report(scores, policy, worst_n, recent_labels, per_rule, source))


async def _build_report(
    scores: Sequence[ScoreEvent],
    policy: Policy,
    worst_n: int,
    recent_labels: int | None,
    per_rule: bool,
    source: str,
) -> ReplayReport:
    main = StreamFold(offline_store(), policy)
    singles = {}
    if per_rule:
        for rule in policy.default.rules:
            single = Policy(
                default=policy.default.model_copy(update={"rules": (rule,)}),
                routes={r: {**o, "rules": (rule,)} for r, o in policy.routes.items()},
            )
            singles[rule] = StreamFold(offline_store(), single)
    routes: dict[str, RouteReport] = {}
    labels: dict[str, list[str | None]] = {}
    for stream_index, score in enumerate(scores):
        rep = routes.setdefault(score.route, RouteReport(score.route))
        bucket = rep.values.setdefault(score.kind, {})
        for name in REPORT_METRICS:
            value = getattr(score.metrics, name, None)
            if value is not None:
                bucket.setdefault(name, []).append(float(value))
        if score.kind == "noise":
            rep.noise_pairs += 1
        else:
            rep.shadow_pairs += 1
            rep.verdicts[score.verdict] = rep.verdicts.get(score.verdict, 0) + 1
            labels.setdefault(score.route, []).append(score.label)
            sim = similarity_of(score)
            if sim is not None:
                rep.similarity.append((rep.shadow_pairs, sim))
        for trip in await main.fold(score, score.ts):
            t = trip.transition
            route_policy = main.route_policy(trip.route)
            recent = recent_labels or route_policy.consecutive_failures
            false = None
            if _is_rollback(t.to_state, t.rule):
                false = _false_rollback(labels.get(trip.route, []), recent)
                if false is not None:
                    rep.labelled_rollbacks += 1
                    rep.false_rollbacks += int(false)
            rep.trips.append(
                TripRow(
                    trip.route,
                    trip.index,
                    stream_index,
                    trip.pair_id,
                    t.rule,
                    t.from_state,
                    t.to_state,
                    t.reason,
                    trip.epoch,
                    false,
                )
            )
        for rule, single_fold in singles.items():
            for trip in await single_fold.fold(score, score.ts):
                if _is_rollback(trip.transition.to_state, trip.transition.rule):
                    fires = routes[trip.route].rule_fires.setdefault(rule, [])
                    fires.append(trip.index)
    for route, rep in routes.items():
        for kind, metrics in rep.values.items():
            for name, vals in metrics.items():
                rep.quantiles.setdefault(name, {})[kind] = quantiles(vals)
        shadow = [s for s in scores if s.route == route and s.kind == "shadow"]
        ranked = sorted(
            shadow,
            key=lambda s: (
                0 if s.verdict != "ok" else 1,
                sim if (sim := similarity_of(s)) is not None else 1.0,
            ),
        )
        rep.worst = [_worst_row(s) for s in ranked[:worst_n]]
    return ReplayReport(routes, len(scores), policy, source)


def _worst_row(s: ScoreEvent) -> dict[str, object]:
    """One worst pair as the report lists it; with its slice, its prompt reference and its
    first divergent token where the score carries them, as an alert shows them."""
    row: dict[str, object] = {
        "pair_id": s.pair_id,
        "similarity": similarity_of(s),
        "verdict": s.verdict,
        "reasons": list(s.reasons),
        "label": s.label,
        "tags": dict(s.tags),
    }
    if s.prompt_excerpt is not None or s.prompt_hash is not None:
        row["prompt" if s.prompt_excerpt is not None else "prompt_hash"] = (
            s.prompt_excerpt if s.prompt_excerpt is not None else s.prompt_hash
        )
    if s.divergence is not None:
        row["first_divergent_token"] = s.divergence.model_dump()
    return row


SCORE_COLUMNS = (
    "index",
    "pair_id",
    "route",
    "kind",
    "ts",
    "decoding",
    "label",
    "verdict",
    "reasons",
    *(
        "cosine",
        "bleu",
        "rouge1",
        "rougeL",
        "jaccard",
        "length_ratio",
        "first_divergence",
        "entropy_mean",
        "entropy_min",
        "entropy_shift",
        "kl",
        "flip_rate",
        "tf_gap",
        "repetition_run",
        "looping",
        "distinct_2",
        "json_ok",
    ),
)


def score_rows(scores: Sequence[ScoreEvent]) -> list[dict[str, object]]:
    """One flat row per score (the CSV/Parquet table), in stream order."""
    rows = []
    for i, s in enumerate(scores):
        m = s.metrics.model_dump()
        row: dict[str, object] = {
            "index": i,
            "pair_id": s.pair_id,
            "route": s.route,
            "kind": s.kind,
            "ts": s.ts,
            "decoding": s.decoding,
            "label": s.label,
            "verdict": s.verdict,
            "reasons": "; ".join(s.reasons),
        }
        for col in SCORE_COLUMNS[9:]:
            row[col] = m.get(col)
        rows.append(row)
    return rows
