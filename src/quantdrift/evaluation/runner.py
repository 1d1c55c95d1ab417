"""Judge scored streams under several policies, in memory, and count what happened.

Per policy, a fresh in-memory store (the breaker's protocol and fold, as the
worker's Redis store, no side effects) is seeded per route stream with the
calibration floor, then fed the stream one pair at a time through
:class:`~quantdrift.breaker.offline.StreamFold` with a simulated clock of
``pair_interval_s`` per pair (cool-downs count in pairs, not in wall time).

* ``false_rollbacks``: closed -> open transitions while the healthy part
  runs (a half-open probe that re-opens is not counted again: users were
  already on the reference).
* ``detection_delay_pairs``: drifted shadow pairs judged up to and
  including the one that opened the breaker (1 = the first drifted pair);
  0 when the route was already open at the onset; None when never opened.
  Over several streams: the largest delay, None if any stream was missed.
* ``pairs_per_s``: all pairs of the streams (shadow and noise) over the
  time of the one shared scoring pass plus this policy's judging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from quantdrift.breaker.offline import StreamFold, offline_store
from quantdrift.breaker.policy import Policy
from quantdrift.detectors.noise_floor import NoiseFloor
from quantdrift.evaluation.cache import ScoreCache, to_score
from quantdrift.evaluation.calibration import floor_seed
from quantdrift.evaluation.streams import EvalPlan, RouteStream
from quantdrift.evaluation.table import text_table

STANDARD_POLICIES = ("default", "seeds", "windowed", "sequential")

# The seeds' rule exactly as the seeds set it: three strikes, cosine < 0.88,
# entropy < 0.05 nats (a loop or a broken JSON contract also fails a pair), text
# similarity only: the teacher-forced divergence is quantdrift's, not the seeds'.
SEEDS_RULE = {
    "teacher_forced": False,
    "rules": ("consecutive",),
    "consecutive_failures": 3,
    "similarity_threshold": 0.88,
    "entropy_floor": 0.05,
    "fixed_rules_on_sampled": True,
}
# The pre-tolerance rules, each alone, for comparison (no error control: the window
# has none, the rank e-CUSUM tests identity against the noise floor).
WINDOWED_RULE = {"rules": ("window",)}
SEQUENTIAL_RULE = {"rules": ("sequential",), "budget_split": {"sequential": 1.0}}


def _with(policy: Policy, update: Mapping[str, Any]) -> Policy:
    return Policy(
        default=policy.default.model_copy(update=dict(update)),
        routes={route: {**o, **update} for route, o in policy.routes.items()},
    )


def standard_policies(base: Policy) -> dict[str, Policy]:
    """default (``base`` as it is: the production default unless a file says otherwise),
    seeds (the seeds' rule only), windowed, sequential (each old rule alone)."""
    return {
        "default": base,
        "seeds": _with(base, SEEDS_RULE),
        "windowed": _with(base, WINDOWED_RULE),
        "sequential": _with(base, SEQUENTIAL_RULE),
    }


@dataclass
class RouteResult:
    route: str
    healthy_pairs: int = 0
    false_rollbacks: int = 0
    first_false_rollback: str | None = None  # "rule @ healthy pair n"
    healthy_pairs_on_reference: int = 0
    drifted_pairs: int = 0
    detection_delay_pairs: int | None = None
    detected_by: str | None = None
    floor_source: dict[str, str] = field(default_factory=dict)


@dataclass
class PolicyResult:
    policy: str
    pairs_seen: int
    healthy_pairs: int
    false_rollbacks: int
    false_rollbacks_per_10k: float | None
    drifted_pairs: int
    detection_delay_pairs: int | None
    detected_by: str | None
    pairs_per_s: float
    judge_pairs_per_s: float
    routes: list[RouteResult]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _run_stream(
    fold: StreamFold, stream: RouteStream, cache: ScoreCache, interval: float
) -> RouteResult:
    result = RouteResult(stream.route, stream.healthy_pairs, drifted_pairs=stream.drifted_pairs)
    now, healthy_seen, drifted_seen, onset_checked = 0.0, 0, 0, False
    policy = fold.route_policy(stream.route)
    for step in stream.steps:
        now += interval
        if step.phase == "drifted" and step.kind == "shadow" and not onset_checked:
            onset_checked = True
            if (await fold.state(stream.route)).state == "open":
                result.detection_delay_pairs, result.detected_by = 0, "open at onset"
        score = to_score(step.pair, cache[step.pair], policy, stream.route).model_copy(
            update={"kind": step.kind, "pair_id": step.pair_id}
        )
        if step.kind == "shadow":
            if step.phase == "healthy":
                healthy_seen += 1
                if (await fold.state(stream.route)).state != "closed":
                    result.healthy_pairs_on_reference += 1
            else:
                drifted_seen += 1
        for trip in await fold.fold(score, now):
            t = trip.transition
            if t.to_state != "open":
                continue
            if step.phase == "healthy" and t.from_state == "closed":
                result.false_rollbacks += 1
                if result.first_false_rollback is None:
                    result.first_false_rollback = f"{t.rule} @ healthy pair {healthy_seen}"
            elif step.phase == "drifted" and result.detection_delay_pairs is None:
                result.detection_delay_pairs, result.detected_by = drifted_seen, t.rule
    return result


async def _judge(
    plan: EvalPlan,
    cache: ScoreCache,
    policy: Policy,
    interval: float,
    noise_floor: NoiseFloor | None,
) -> list[RouteResult]:
    """One store for the policy; each route stream seeded with its floor, then judged."""
    fold = StreamFold(offline_store(noise_floor), policy)
    routes = []
    for stream in plan.streams:
        route_policy = fold.route_policy(stream.route)
        calibration = [to_score(p, cache[p], route_policy, stream.route) for p in plan.calibration]
        seed, source = floor_seed(calibration, route_policy.min_noise_pairs)
        for mode, rows in seed.items():
            if rows:
                await fold.store.seed_floor(stream.route, mode, rows, merge=True)
        route_result = await _run_stream(fold, stream, cache, interval)
        route_result.floor_source = {m: s for m, s in source.items() if seed[m]}
        routes.append(route_result)
    return routes


def evaluate(
    plan: EvalPlan,
    cache: ScoreCache,
    policies: Mapping[str, Policy],
    *,
    pair_interval_s: float = 1.0,
    noise_floor: NoiseFloor | None = None,
) -> list[PolicyResult]:
    """One result per policy; ``cache`` must hold every pair of ``plan`` (``cache.fill``)."""
    cache.fill(plan.pairs())
    results = []
    for name, policy in policies.items():
        t0 = time.perf_counter()
        routes = asyncio.run(_judge(plan, cache, policy, pair_interval_s, noise_floor))
        judge_s = time.perf_counter() - t0
        pairs = sum(len(s.steps) for s in plan.streams)
        healthy = sum(r.healthy_pairs for r in routes)
        drifted = sum(r.drifted_pairs for r in routes)
        delays = [r.detection_delay_pairs for r in routes if r.drifted_pairs]
        delay = None if not delays or any(d is None for d in delays) else max(delays)  # type: ignore[type-var]
        by = next((r.detected_by for r in routes if r.detection_delay_pairs == delay), None)
        false = sum(r.false_rollbacks for r in routes)
        results.append(
            PolicyResult(
                policy=name,
                pairs_seen=pairs,
                healthy_pairs=healthy,
                false_rollbacks=false,
                false_rollbacks_per_10k=round(1e4 * false / healthy, 1) if healthy else None,
                drifted_pairs=drifted,
                detection_delay_pairs=delay,
                detected_by=by if delay is not None else None,
                pairs_per_s=round(pairs / max(cache.seconds + judge_s, 1e-9), 1),
                judge_pairs_per_s=round(pairs / max(judge_s, 1e-9), 1),
                routes=routes,
            )
        )
    return results


def format_table(results: list[PolicyResult]) -> str:
    """A plain-text table, one row per policy."""
    header = (
        "policy",
        "pairs",
        "healthy",
        "false rollbacks",
        "per 10k",
        "drifted",
        "delay",
        "by",
        "pairs/s",
    )

    def fmt(x: object) -> str:
        return "-" if x is None else str(x)

    body = [
        (
            r.policy,
            str(r.pairs_seen),
            str(r.healthy_pairs),
            str(r.false_rollbacks),
            fmt(r.false_rollbacks_per_10k),
            str(r.drifted_pairs),
            fmt(r.detection_delay_pairs) if r.drifted_pairs else "-",
            fmt(r.detected_by),
            f"{r.pairs_per_s:.0f}",
        )
        for r in results
    ]
    return text_table(header, body)
