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
from collections.abc import Mapping
from dataclasses import dataclass, field

from quantdrift.schemas.score import Metrics

# Direction of each metric that says "worse than the reference": lower or higher.
LOWER_IS_WORSE = ("cosine", "rougeL", "rouge1", "bleu", "jaccard")
HIGHER_IS_WORSE = ("kl", "flip_rate", "tf_gap")
FLOOR_METRICS = LOWER_IS_WORSE + HIGHER_IS_WORSE


def metric_values(metrics: Metrics) -> dict[str, float]:
    """The floor's metrics that this pair has (None ones are left out)."""
    out = {}
    for name in FLOOR_METRICS:
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
        """Bonferroni-combined p-value over the metrics with a calibrated floor.

        None until at least one metric has ``min_count`` noise values: no
        sequential evidence is counted against an uncalibrated route.
        """
        ps = [
            p
            for name, x in values.items()
            if state.count(name) >= min_count
            and (p := self.metric_p_value(state, name, x)) is not None
        ]
        if not ps:
            return None
        return min(1.0, min(ps) * len(ps))

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
