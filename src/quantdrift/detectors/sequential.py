"""Sequential change detectors on a per-pair stream, state in and state out.

The judge keeps the state in Redis, so each detector is a frozen parameter
object with ``init()`` and ``update(state, x) -> (state, Signal)``; states are
small frozen dataclasses that survive a JSON round-trip (``asdict`` / ``**``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Signal:
    """What one update says: did it alarm, and how close the statistic is."""

    drift_detected: bool
    statistic: float
    threshold: float


@dataclass(frozen=True, slots=True)
class CusumState:
    n: int = 0
    upper: float = 0.0


@dataclass(frozen=True, slots=True)
class Cusum:
    """One-sided CUSUM on a drift score that is ~0 under the noise floor.

    Examples
    --------
    >>> test = Cusum(slack=0.5, threshold=4.0, min_instances=5)
    >>> state, alarms = test.init(), []
    >>> for i, x in enumerate([0.0] * 20 + [2.0] * 5):
    ...     state, signal = test.update(state, x)
    ...     if signal.drift_detected:
    ...         alarms.append(i)
    >>> alarms
    [22]
    """

    slack: float = 0.5
    threshold: float = 5.0
    min_instances: int = 30

    def __post_init__(self) -> None:
        if self.threshold <= 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold}")

    def init(self) -> CusumState:
        return CusumState()

    def update(self, state: CusumState, x: float) -> tuple[CusumState, Signal]:
        n, upper = state.n + 1, max(0.0, state.upper + x - self.slack)
        drift = n >= self.min_instances and upper > self.threshold
        # Restart after an alarm so one shift is reported once.
        return (self.init() if drift else CusumState(n, upper)), Signal(
            drift, upper, self.threshold
        )


@dataclass(frozen=True, slots=True)
class ECusumState:
    n: int = 0
    log_m: float = 0.0


@dataclass(frozen=True, slots=True)
class ECusum:
    """e-CUSUM detector (Shin, Ramdas & Rinaldo, "E-detectors", 2022) on p-values.

    Each pair brings a p-value against the route's noise floor (uniform, or
    larger, while the candidate behaves like the reference). It is turned into
    an e-value ``e = kappa * p**(kappa - 1)`` (mean <= 1 under no drift) and the
    detector runs ``M_n = e_n * max(M_{n-1}, 1)``, alarming when ``M_n >= A``.
    The e-detector guarantee is that the mean number of pairs before a false
    alarm is at least ``A``: so ``A`` *is* the false-rollback budget from the
    policy, not a hand-set threshold.

    Examples
    --------
    >>> test = ECusum(false_alarm_budget=1000.0, min_instances=5)
    >>> state, alarms = test.init(), []
    >>> for i, p in enumerate([0.5] * 20 + [0.001] * 10):
    ...     state, signal = test.update(state, p)
    ...     if signal.drift_detected:
    ...         alarms.append(i)
    >>> alarms
    [22, 27]
    """

    false_alarm_budget: float = 10_000.0
    kappa: float = 0.5
    min_instances: int = 1

    def __post_init__(self) -> None:
        if self.false_alarm_budget <= 1:
            raise ValueError(f"false_alarm_budget must be > 1, got {self.false_alarm_budget}")
        if not 0 < self.kappa < 1:
            raise ValueError(f"kappa must be in (0, 1), got {self.kappa}")

    @property
    def threshold(self) -> float:
        return math.log(self.false_alarm_budget)

    def init(self) -> ECusumState:
        return ECusumState()

    def e_value(self, p: float) -> float:
        p = min(1.0, max(p, 1e-12))
        return self.kappa * p ** (self.kappa - 1.0)

    def update(self, state: ECusumState, p: float) -> tuple[ECusumState, Signal]:
        log_e = math.log(self.e_value(p))
        log_m = max(state.log_m, 0.0) + log_e
        n = state.n + 1
        drift = n >= self.min_instances and log_m >= self.threshold
        new = self.init() if drift else ECusumState(n, log_m)
        return new, Signal(drift, log_m, self.threshold)
