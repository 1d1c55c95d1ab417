"""The noise floor: how much two reference runs disagree, metric by metric.

Absolute thresholds are a trap (a healthy quantized model already scores
ROUGE-L ~0.46 against BF16), so a shadow pair is judged by where it falls in
the distribution of the same metric on reference-vs-reference pairs of the same
route and decoding mode. The floor keeps the last ``capacity`` values per metric
(a ring, not a reservoir: deterministic, and it follows a slowly moving
baseline), which is also what makes its state a small JSON value for Redis.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from quantdrift.schemas.score import Metrics

# Below these spreads a floor says nothing about normal disagreement (float noise,
# identical greedy runs): the metric is dropped, not trusted. Shared with the
# tolerance rule (detectors/tolerance.py).
RESOLUTION = {
    "tf_kl": 1e-3,
    "tf_gap": 1e-3,
    "kl": 1e-3,
    "cosine": 1e-3,
    "rougeL": 1e-2,
    "rouge1": 1e-2,
    "jaccard": 1e-2,
    "bleu": 1e-2,
    "flip_rate": 1e-2,
    "abs_entropy_shift": 1e-3,
}


def resolution(metric: str) -> float:
    """The smallest spread of a floor that says something; any spread for others."""
    return RESOLUTION.get(metric, 1e-12)


# Direction of each metric that says "worse than the reference": lower or higher.
LOWER_IS_WORSE = ("cosine", "rougeL", "rouge1", "bleu", "jaccard")
HIGHER_IS_WORSE = ("kl", "flip_rate", "tf_gap", "tf_kl", "abs_entropy_shift")
FLOOR_METRICS = LOWER_IS_WORSE + HIGHER_IS_WORSE


def metric_values(metrics: Metrics) -> dict[str, float]:
    """The floor's metrics that this pair has (None ones are left out).

    ``abs_entropy_shift`` is |entropy_shift|: the tolerance rule asks how far the
    candidate's uncertainty moved from the reference's, in either direction.
    """
    out = {}
    for name in FLOOR_METRICS:
        if name == "abs_entropy_shift":
            value = None if metrics.entropy_shift is None else abs(metrics.entropy_shift)
        else:
            value = getattr(metrics, name, None)
        if value is not None:
            out[name] = float(value)
    return out


@dataclass(frozen=True, slots=True)
class NoiseFloorState:
    """Per metric: the recent noise values in arrival order."""

    values: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def count(self, metric: str) -> int:
        return len(self.values.get(metric, ()))

    def to_json(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in self.values.items()}

    def sha256(self) -> str:
        """The floor's identity: SHA-256 of its values as compact JSON, keys sorted.

        ``quantdrift calibrate`` prints it when it writes a floor and a certificate's
        live evidence carries it, so a reader can tell which calibration a route was
        judged against (live noise pairs folded since then change it).

        >>> NoiseFloorState({"cosine": (0.5,)}).sha256()[:12]
        '7be172f13ffa'
        """
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_json(cls, data: Mapping[str, list[float]] | None) -> NoiseFloorState:
        return cls({k: tuple(float(x) for x in v) for k, v in (data or {}).items()})


@dataclass(frozen=True, slots=True)
class NoiseFloor:
    """Online noise floor with a p-value for a shadow pair.

    Examples
    --------
    >>> floor = NoiseFloor(capacity=100)
    >>> state = floor.init()
    >>> for c in [0.90, 0.92, 0.94, 0.96, 0.98]:
    ...     state = floor.update(state, {"cosine": c})
    >>> floor.p_value(state, {"cosine": 0.91}, min_count=5)  # 1 of 5 noise pairs <= 0.91
    0.3333333333333333
    >>> floor.p_value(state, {"cosine": 0.50}, min_count=5)  # below every noise pair
    0.16666666666666666
    """

    capacity: int = 512

    def init(self) -> NoiseFloorState:
        return NoiseFloorState()

    def update(self, state: NoiseFloorState, values: Mapping[str, float]) -> NoiseFloorState:
        merged = dict(state.values)
        for name, value in values.items():
            merged[name] = (*merged.get(name, ()), float(value))[-self.capacity :]
        return NoiseFloorState(merged)

    def extend(
        self, state: NoiseFloorState, rows: Iterable[Mapping[str, float]]
    ) -> NoiseFloorState:
        """``state`` with every row folded in, in order: how a calibration's seed rows
        become a floor, in each store and wherever a floor is built from them."""
        for row in rows:
            state = self.update(state, row)
        return state

    def metric_p_value(self, state: NoiseFloorState, metric: str, x: float) -> float | None:
        """Rank p-value of x among the noise values, in the metric's worse direction."""
        sample = sorted(state.values.get(metric, ()))
        n = len(sample)
        if n == 0:
            return None
        if metric in HIGHER_IS_WORSE:
            as_bad = n - bisect.bisect_left(sample, x)
        else:
            as_bad = bisect.bisect_right(sample, x)
        return (1 + as_bad) / (n + 1)

    def p_value(
        self, state: NoiseFloorState, values: Mapping[str, float], min_count: int
    ) -> float | None:
        """Conformal p-value of the pair's worst metric rank among the noise pairs.

        Each pair (the shadow one and every noise one) gets a score: over the
        metrics, the smallest count of noise values at least as bad as its own
        (the shadow pair counted in; "bad" in each metric's worse direction). The
        p-value is the share of the n + 1 pairs whose score is as extreme as the
        shadow pair's. Were the shadow pair exchangeable with the noise pairs,
        this is super-uniform (a valid p-value) whatever the metrics' dependence,
        and it keeps the resolution 1 / (n + 1) of a single metric: Bonferroni
        over m metrics (the first version) multiplied the smallest p by m, and
        on the lab's 80 noise pairs and 8 metrics no shadow pair could go below
        0.1, so the e-CUSUM needed > 20 pairs for even the most broken variant.

        Only metrics with ``min_count`` noise values and a spread of at least the
        metric's resolution take part: a floor that never varies (two *greedy*
        reference runs are identical; the teacher-forced KL of a model against
        itself moves by 1e-5 nats) cannot say how much disagreement is normal, and
        ranking against it would call every different text a drift. None when no metric
        qualifies: no sequential evidence against an uncalibrated route. The
        metrics' rings are aligned on their common tail (noise pairs carry the
        same metrics, so the tails are the same pairs).
        """
        names = []
        for name, x in values.items():
            sample = state.values.get(name, ())
            spread = max(sample) - min(sample) if sample else 0.0
            if len(sample) >= min_count and spread >= resolution(name) and math.isfinite(x):
                names.append(name)
        if not names:
            return None
        n = min(state.count(name) for name in names)
        noise_score = np.full(n, n + 2, dtype=np.int64)
        pair_score = n + 2
        for name in names:
            # Orient every metric so that larger is worse.
            sign = 1.0 if name in HIGHER_IS_WORSE else -1.0
            v = sign * np.asarray(state.values[name][-n:], dtype=np.float64)
            x = sign * float(values[name])
            ordered = np.sort(v)
            at_least_as_bad = n - np.searchsorted(ordered, v, side="left") + (x >= v)
            noise_score = np.minimum(noise_score, at_least_as_bad)
            pair_score = min(pair_score, 1 + n - int(np.searchsorted(ordered, x, side="left")))
        return float((1 + int(np.sum(noise_score <= pair_score))) / (n + 1))

    def effect_sizes(self, state: NoiseFloorState, values: Mapping[str, float]) -> dict[str, float]:
        """Per metric: (x - noise median) / noise IQR-based scale, for alerts to explain."""
        out = {}
        for name, x in values.items():
            sample = sorted(state.values.get(name, ()))
            if len(sample) < 4:
                continue
            median = sample[len(sample) // 2]
            iqr = sample[(3 * len(sample)) // 4] - sample[len(sample) // 4]
            scale = iqr / 1.349 if iqr > 0 else 1e-3
            out[name] = round((x - median) / scale, 3)
        return out
