"""What a shadow pair says to the rules: the judge's reading of one score, made once.

The route's policy is applied to a pair here and nowhere else in the judge.
:func:`read` takes the per-pair thresholds from the policy
(:func:`~quantdrift.breaker.policy.failure_thresholds`) and reads the score's
*metrics* with them, once:

* **the verdict** (``ok`` / ``drift`` / ``anomaly``) and its reasons
  (:func:`~quantdrift.detectors.suite.verdict`);
* **the hard failure** the tolerance rule's ``hard`` test counts (a hard failure
  the reference does not show, a narrower question than the verdict's anomaly);
* **what the verdict means to the rules** (a sampled pair fails the fixed rules only
  as an anomaly, unless ``fixed_rules_on_sampled``; the window averages the
  teacher-forced divergence instead of the similarity when the policy trusts it).

No rule looks at the thresholds, the decoding or those policy fields itself, and
the judge never reads the ``verdict`` a score carries on the wire: that one is the
scoring worker's reading under its own copy of the policy, kept for the people and
tools that read scores (OpenTelemetry, replay reports), not for deciding. So the
judge's policy alone decides a route, a policy change applies to scores already in
flight, and a recorded scores topic replayed under another policy is judged by it
(docs/architecture.md, "Where the policy is applied").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantdrift.breaker.policy import RoutePolicy, failure_thresholds
from quantdrift.detectors.noise_floor import NoiseFloorState
from quantdrift.detectors.suite import hard_failures, verdict
from quantdrift.schemas.score import ScoreEvent, Verdict


@dataclass(frozen=True, slots=True)
class Pair:
    """One shadow pair as every rule sees it.

    ``verdict`` / ``reasons``: the pair's verdict under the judge's policy;
    ``failing``: the pair fails the fixed rules and the half-open probe;
    ``similarity``: the number the status page and the worst pairs show;
    ``windowed`` / ``anomaly`` / ``tf_kl``: the window rule's entry;
    ``hard``: a hard failure the reference does not show (the tolerance ``hard`` test);
    ``floor``: the route's noise floor for the pair's decoding mode, if any.
    """

    score: ScoreEvent
    floor: NoiseFloorState | None
    verdict: Verdict
    reasons: tuple[str, ...]
    failing: bool
    similarity: float | None
    windowed: float | None
    anomaly: bool
    hard: bool
    tf_kl: float | None


@dataclass(frozen=True, slots=True)
class Fired:
    """A rule's alarm: the name a transition carries, why, and the numbers behind it."""

    rule: str
    reason: str
    evidence: dict[str, Any]


def similarity_of(score: ScoreEvent) -> float | None:
    """Cosine when the embedder ran, else ROUGE-L: the window rule needs one number."""
    m = score.metrics
    return m.cosine if m.cosine is not None else m.rougeL


def judged_by_similarity(policy: RoutePolicy, score: ScoreEvent) -> bool:
    """Absolute similarity means something for greedy pairs; for sampled ones only
    when the policy says so (``fixed_rules_on_sampled``): two samples of the same
    model already disagree far below any fixed threshold."""
    return score.decoding == "greedy" or policy.fixed_rules_on_sampled


def read(policy: RoutePolicy, score: ScoreEvent, floor: NoiseFloorState | None) -> Pair:
    """The pair's reading under ``policy``.

    The seeds' failure is a verdict that is not ok; a sampled pair not judged by
    similarity fails only as an anomaly. With teacher-forced evidence the window
    averages that divergence, not the text similarity: a healthy int8 route's
    greedy cosines hover around 0.85 (near-ties amplified), so one broken pair
    would tip a similarity window over the bar.
    """
    thresholds = failure_thresholds(policy)
    found, reasons = verdict(score.metrics, thresholds)
    by_similarity = judged_by_similarity(policy, score)
    failing = found != "ok" if by_similarity else found == "anomaly"
    similarity = similarity_of(score)
    tf = score.metrics.tf_kl if policy.teacher_forced else None
    return Pair(
        score=score,
        floor=floor,
        verdict=found,
        reasons=tuple(reasons),
        failing=failing,
        similarity=similarity,
        windowed=similarity if by_similarity and tf is None else None,
        anomaly=found == "anomaly",
        hard=bool(hard_failures(score.metrics, thresholds)),
        tf_kl=tf,
    )
