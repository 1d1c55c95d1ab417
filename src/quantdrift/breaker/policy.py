"""Per-route decision policy, from settings defaults and a YAML file.

```yaml
default:            # every field optional; these are the defaults
  consecutive_failures: 3
  similarity_threshold: 0.88
routes:
  cs-agent/int4:
    min_pairs: 50
```
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from quantdrift.config_env import first_problem, read_yaml_mapping
from quantdrift.detectors.suite import FailureThresholds
from quantdrift.detectors.tolerance import CALIBRATION_MIX_RATIO, SIGNALS
from quantdrift.errors import ConfigError

Rule = Literal["tolerance", "consecutive", "window", "sequential"]
# Where the route's one false-rollback budget goes: every anytime-valid test the
# policy runs gets its weight over the sum of their weights (breaker/rules/tolerance.py), so
# the false-alarm rates add up to at most one per budget. The fixed rules
# (consecutive, window) have no error control and no share: they exist for the
# named comparison policies, not for the default.
BudgetShare = Literal[
    "hard", "outcomes", "tf_kl", "dissimilarity", "lexical", "entropy", "sequential"
]
# What a policy may name in ``relies_on``: a tolerance signal or a fixed rule.
ReliedOn = Literal[
    "hard",
    "outcomes",
    "tf_kl",
    "dissimilarity",
    "lexical",
    "entropy",
    "sequential",
    "consecutive",
    "window",
]
# Slice dimensions: tag names of ``PairEvent.tags`` (gateway/chain/slices.py).
_TAG_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
DEFAULT_SLICE_DIMENSIONS = ("language", "length", "output")
DEFAULT_SPLIT: dict[BudgetShare, float] = {
    "hard": 0.3,
    "outcomes": 0.2,
    "tf_kl": 0.2,
    "dissimilarity": 0.2,
    "lexical": 0.2,
    "entropy": 0.1,
    "sequential": 0.2,
}


class RoutePolicy(BaseModel):
    """Every threshold of the decision for one route. Frozen: a policy is a value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The default is the tolerance rule alone: "is the candidate worse than the
    # reference by more than δ?", one anytime-valid test per signal on one budget.
    rules: tuple[Rule, ...] = ("tolerance",)
    # Seeds' rule: K consecutive failing pairs.
    consecutive_failures: int = Field(default=3, ge=1)
    similarity_threshold: float = Field(default=0.88, ge=-1, le=1)
    entropy_floor: float = Field(default=0.05, ge=0)
    # Per-pair failure on teacher-forced divergence (nats), when pairs carry it.
    tf_kl_threshold: float = Field(default=0.1, gt=0)
    # Off: judge by text similarity even when the pair carries teacher-forced
    # log-probs (the seeds' rule as written; eval reports it that way).
    teacher_forced: bool = True
    # Whether the fixed rules (consecutive, window) judge *sampled* pairs by absolute
    # similarity. Off by default, measured on the lab's SmolLM2-135M pairs
    # (temperature 0.7): two sampled reference runs score cosine 0.47-0.54 and int8
    # sampled pairs 0.53-0.60, every one a "drift" under 0.88, so three sampled pairs
    # in a row roll back a healthy int8 model. Off, a sampled pair fails these rules
    # only as an anomaly (loop, broken JSON, collapsed entropy) and its similarity
    # stays out of the window; its disagreement is judged against the sampled noise
    # floor by the sequential rule. The seeds' rule as they wrote it is ``True``.
    fixed_rules_on_sampled: bool = False
    # Windowed rates over the last ``window_size`` shadow pairs.
    window_size: int = Field(default=50, ge=1)
    window_mean_similarity: float = Field(default=0.85, ge=-1, le=1)
    # Without an embedder the window averages ROUGE-L, whose healthy level is far lower
    # (~0.46 for a healthy quantized 8B model, ~0.6 on the demo's paraphrases): comparing
    # it to the cosine-scale 0.85 rolled back healthy traffic after min_pairs.
    window_mean_lexical: float = Field(default=0.35, ge=0, le=1)
    window_anomaly_rate: float = Field(default=0.10, ge=0, le=1)
    # No rule fires before this many shadow pairs: a quiet route cannot roll back a fleet.
    min_pairs: int = Field(default=20, ge=1)
    # The route's one false-rollback budget: the mean number of healthy shadow pairs
    # between false rollbacks is at least this (a guaranteed lower bound, whatever the
    # data, as long as the candidate is within tolerance). Split by ``budget_split``.
    false_alarm_budget_pairs: float = Field(default=1e6, gt=1)
    budget_split: dict[BudgetShare, float] = Field(default_factory=lambda: dict(DEFAULT_SPLIT))
    # Slices (breaker/rules/slices.py): the tag dimensions judged per value beside the
    # route as a whole, inside the same budget. The aggregate tests get 1 - slice_share
    # of it, each dimension slice_share / len(slice_dimensions), and every value of a
    # dimension that whole dimension's share: values split the pairs, so their tests'
    # false alarms add up to one dimension's (docs/deciding.md has the proof). Empty:
    # no slices, the aggregate gets the whole budget.
    slice_dimensions: tuple[str, ...] = DEFAULT_SLICE_DIMENSIONS
    slice_share: float = Field(default=0.5, gt=0, lt=1)
    # Per dimension at most this many values get a test of their own, "other" included:
    # the first ones a route sees; every later value pools into "other".
    slice_max_values: int = Field(default=8, ge=2, le=32)
    # Below this many pairs a slice is "insufficient data": its test runs (evidence is
    # kept) but cannot roll back, and it never reads as a pass.
    slice_min_pairs: int = Field(default=20, ge=1)
    # What a slice's alarm rolls back (breaker/slice_scope.py): the whole route (the default),
    # or only the failing slice: its requests go to the reference, the rest of the route
    # stays on the candidate, and the slice half-opens and restores on its own. Pooled
    # "other" slices have no selector a gateway can match and always widen to the route.
    rollback_scope: Literal["route", "slice"] = "route"
    # A slice-scoped rollback widens to the whole route when the slice trips this many
    # times (its first trip and each failed half-open probe) ...
    widen_after_trips: int = Field(default=2, ge=1)
    # ... or when this many slices would be rolled back at once.
    widen_after_slices: int = Field(default=2, ge=1)
    # ... or when a failing candidate pair of a rolled-back slice is built this long after
    # its trip: no longer one in flight (a gateway bounds a shadow pair by its
    # timeouts.shadow_total_s, 30 s by default) but a gateway that still serves the slice
    # from the candidate (one that cannot map the slice refuses the command).
    slice_stray_grace_s: float = Field(default=60.0, gt=0)
    # Tolerances δ: how much worse than the reference a route owner accepts.
    # Paired task outcomes (JSON kept, loop-free, finished): failure-rate difference.
    tolerance_outcomes: float = Field(default=0.05, ge=0, lt=1)
    # Hard failures the reference does not show (loops, entropy collapse): a rate.
    # Small, so that each one is strong evidence: int2 / int3 loop on most answers.
    tolerance_hard: float = Field(default=0.02, gt=0, lt=1)
    # Divergences above the floor's mean: nats of teacher-forced KL (clipped at
    # tf_kl_clip), points of 1 - cosine, nats of |entropy shift| (clipped).
    tolerance_tf_kl: float = Field(default=0.05, ge=0)
    tolerance_dissimilarity: float = Field(default=0.1, ge=0, le=1)
    # Points of 1 - ROUGE-L F1 above the floor (the lexical test, beside the cosine one).
    tolerance_lexical: float = Field(default=0.1, ge=0, le=1)
    tolerance_entropy: float = Field(default=0.3, ge=0)
    # The clips bound what one pair can say (one wild pair is not a drift); a test
    # of "mean <= m0" on x >= 0 needs no clip to be valid.
    tf_kl_clip: float = Field(default=4.0, gt=0)
    entropy_clip: float = Field(default=2.0, gt=0)
    # A divergence's floor (blessed baseline, else noise pairs) needs this many
    # values; its mean is bounded over prompt mixes within calibration_mix_ratio and
    # by a t bound at CALIBRATION_ALPHA (detectors/tolerance.py), so a small one is cautious.
    min_floor_pairs: int = Field(default=10, ge=2)
    # How far the route's traffic may move from the calibration's prompt mix: each kind
    # of prompt up to this many times as often (or 1 / this as often). The default is
    # detectors.tolerance.CALIBRATION_MIX_RATIO; a route whose traffic is a few prompts
    # the calibration did not weigh alike needs more (docs/deciding.md has the price).
    calibration_mix_ratio: float = Field(default=CALIBRATION_MIX_RATIO, ge=1.0)
    min_noise_pairs: int = Field(default=30, ge=1)
    # The tests the route must be able to run before it is *armed* (route status, the
    # verdict API, preflight; breaker/readiness.py). None: the rules the policy lists,
    # and of the tolerance rule its hard and outcome tests plus every divergence test
    # whose evidence the route's pairs carry (tf_kl once a pair carries teacher-forced
    # log-probs, dissimilarity once one carries a cosine, ...). Name them to require
    # evidence the pairs may lack, e.g. ``[tf_kl]`` for a pool that must teacher-force.
    relies_on: tuple[ReliedOn, ...] | None = None
    # After this many shadow pairs of one candidate (and at least min_pairs), a relied-on
    # test that still cannot fire raises one P2 alert (``breaker.not_armed``).
    unarmed_alert_pairs: int = Field(default=100, ge=1)
    # Breaker timing.
    cooldown_s: float = Field(default=60.0, gt=0)
    cooldown_backoff: float = Field(default=2.0, ge=1)
    max_cooldown_s: float = Field(default=3600.0, gt=0)
    half_open_pairs: int = Field(default=20, ge=1)
    # Commands name the side by role (candidate / reference), which each gateway maps
    # onto its own pools. Optionally the concrete precision too, as a hint a gateway
    # checks against its mapping (a contradiction is refused, never served).
    candidate_precision: str | None = None
    reference_precision: str | None = None
    worst_pairs_kept: int = Field(default=3, ge=0, le=20)

    @property
    def aggregate_share(self) -> float:
        """The aggregate tests' share of the route's budget (all of it without slices)."""
        return 1.0 - self.slice_share if self.slice_dimensions else 1.0

    @property
    def dimension_share(self) -> float:
        """Each slice dimension's share of the budget, which each of its values' tests use."""
        dims = len(set(self.slice_dimensions))
        return self.slice_share / dims if dims else 0.0

    @model_validator(mode="after")
    def _budget_split_ok(self) -> RoutePolicy:
        if len(set(self.slice_dimensions)) != len(self.slice_dimensions):
            raise ValueError("slice_dimensions: each dimension once")
        for dim in self.slice_dimensions:
            if not _TAG_NAME.match(dim):
                raise ValueError(f"slice_dimensions: {dim!r} is not a tag name ([a-z0-9_])")
        if any(v < 0 for v in self.budget_split.values()):
            raise ValueError("budget_split weights must be >= 0")
        if "sequential" in self.rules and self.budget_split.get("sequential", 0) <= 0:
            raise ValueError("rule 'sequential' needs a weight: set budget_split.sequential")
        weights = {str(k): v for k, v in self.budget_split.items()}
        for name in self.relies_on or ():
            tolerance = "tolerance" in self.rules and name in SIGNALS
            runs = name in self.rules or (tolerance and weights.get(name, 0) > 0)
            if not runs:
                raise ValueError(
                    f"relies_on names {name!r}, which the policy does not run "
                    f"(rules: {', '.join(self.rules)})"
                )
        return self


def failure_thresholds(policy: RoutePolicy) -> FailureThresholds:
    """The per-pair verdict's thresholds under a route policy: one place for every caller."""
    return FailureThresholds(
        similarity=policy.similarity_threshold,
        entropy_floor=policy.entropy_floor,
        tf_kl=policy.tf_kl_threshold if policy.teacher_forced else None,
    )


def thresholds_for(policy: Policy, route: str) -> FailureThresholds:
    """The per-pair verdict's thresholds for ``route``: what the score agent, replay and
    eval attach to each score, so all of them judge a pair alike."""
    return failure_thresholds(policy.for_route(route))


class Policy(BaseModel):
    """The default policy plus per-route overrides (only the fields they name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    default: RoutePolicy = RoutePolicy()
    routes: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def for_route(self, route: str) -> RoutePolicy:
        override = self.routes.get(route)
        if not override:
            return self.default
        return RoutePolicy.model_validate({**self.default.model_dump(), **override})

    def thresholds(self, route: str) -> FailureThresholds:
        return thresholds_for(self, route)

    def validate_routes(self) -> Policy:
        """Fail at load, not at the first pair of a misconfigured route."""
        for route in self.routes:
            try:
                self.for_route(route)
            except ValidationError as exc:
                raise ConfigError(f"policy for route {route!r}: {exc}") from exc
        return self


def load_policy(path: Path | None) -> Policy:
    """Read a YAML policy file; None gives the built-in defaults."""
    if path is None:
        return Policy()
    data = read_yaml_mapping(path, "policy file")
    try:
        return Policy.model_validate(data).validate_routes()
    except ValidationError as exc:
        raise ConfigError(first_problem(exc, f"policy file {path}")) from exc
