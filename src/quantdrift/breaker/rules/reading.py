"""What a shadow pair says to the rules: the judge's reading of one score, made once.

The policy is applied in two steps, each in one place:

* **the verdict** (``ok`` / ``drift`` / ``anomaly``) is made at scoring time, with
  the thresholds :func:`~quantdrift.breaker.policy.failure_thresholds` takes from
  the route's policy (the score agent, replay and eval all call it through
  ``thresholds_for``). The judge never re-makes it: it reads ``score.verdict``;
* **what a verdict means to the rules** (a sampled pair fails the fixed rules only
  as an anomaly, unless ``fixed_rules_on_sampled``; the window averages the
  teacher-forced divergence instead of the similarity when the policy trusts it)
  is decided here, by :func:`read`, once per pair; no rule looks at the verdict,
  the decoding or those policy fields itself.

The tolerance rule's hard-failure signal reads the metrics (a hard failure the
reference does not show is a narrower question than the verdict's anomaly), with
the same thresholds from ``failure_thresholds``, so one setting moves both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.detectors.noise_floor import NoiseFloorState
from quantdrift.schemas.score import ScoreEvent


@dataclass(frozen=True, slots=True)
class Pair:
    """One shadow pair as every rule sees it.

    ``failing``: the pair fails the fixed rules and the half-open probe;
    ``similarity``: the number the status page and the worst pairs show;
    ``windowed`` / ``anomaly`` / ``tf_kl``: the window rule's entry;
    ``floor``: the route's noise floor for the pair's decoding mode, if any.
    """

    score: ScoreEvent
    floor: NoiseFloorState | None
    failing: bool
    similarity: float | None
    windowed: float | None
    anomaly: bool
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
    by_similarity = judged_by_similarity(policy, score)
    failing = score.verdict != "ok" if by_similarity else score.verdict == "anomaly"
    similarity = similarity_of(score)
    tf = score.metrics.tf_kl if policy.teacher_forced else None
    return Pair(
        score=score,
        floor=floor,
        failing=failing,
        similarity=similarity,
        windowed=similarity if by_similarity and tf is None else None,
        anomaly=score.verdict == "anomaly",
        tf_kl=tf,
    )
