"""The rank e-CUSUM rule: each pair's p-value against the route's noise floor."""

from __future__ import annotations

from dataclasses import dataclass

from quantdrift.breaker.rules.reading import Fired, Pair
from quantdrift.detectors.noise_floor import NoiseFloor, metric_values
from quantdrift.detectors.sequential import ECusum, ECusumState


@dataclass(frozen=True, slots=True)
class Sequential:
    """:class:`~quantdrift.detectors.sequential.ECusum` on the pair's p-value under the
    floor of its decoding mode; a pair without a floor of ``min_noise_pairs`` values
    says nothing and leaves the state alone. The test restarts after an alarm, so an
    alarm held back by ``min_pairs`` is not kept (the tolerance rule keeps its own)."""

    test: ECusum
    noise_floor: NoiseFloor
    min_noise_pairs: int = 30

    def init(self) -> ECusumState:
        return self.test.init()

    def update(self, state: ECusumState, pair: Pair) -> tuple[ECusumState, Fired | None]:
        if pair.floor is None:
            return state, None
        values = metric_values(pair.score.metrics)
        p = self.noise_floor.p_value(pair.floor, values, self.min_noise_pairs)
        if p is None:
            return state, None
        new, signal = self.test.update(state, p)
        if not signal.drift_detected:
            return new, None
        return new, Fired(
            "sequential",
            f"e-CUSUM log M {signal.statistic:.2f} >= {self.test.threshold:.2f}",
            {"log_m": round(signal.statistic, 3), "threshold": round(self.test.threshold, 3)},
        )
