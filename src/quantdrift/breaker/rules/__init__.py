"""The decision rules, each a detector that owns its slice of a route's state.

Every rule has the shape of a detector (STYLE: parameters frozen, state in and state
out): a frozen object built from the route's policy, ``init()`` and
``update(state, pair) -> (state, Fired | None)``, where ``pair`` is the judge's
one reading of a shadow score (:mod:`.reading`). A route's evidence is
:class:`RuleStates`, one typed state per rule; the breaker's lifecycle (state,
epoch, target, lock, cool-down) lives beside it in ``RouteState``.

* closed routes run the rules the policy lists (:func:`closed_rules`, in its order:
  the first alarm wins): ``consecutive``, ``window``, ``sequential`` and
  ``tolerance`` (whose ``hard`` signal is the fast trip on hard failures), and after
  them, when the policy judges slices, ``slices`` (:mod:`.slices`: the tolerance
  tests per value of each tag dimension, inside the same budget);
* half-open routes run the probe (:mod:`.probe`).

Every rule runs from a route's first pair; ``min_pairs`` only holds the alarms
back (``machine.judge``). A transition restarts every rule (``RuleStates()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules.consecutive import Consecutive, ConsecutiveState
from quantdrift.breaker.rules.probe import HalfOpenProbe, ProbeState
from quantdrift.breaker.rules.reading import Fired, Pair, read, similarity_of
from quantdrift.breaker.rules.sequential import Sequential
from quantdrift.breaker.rules.slices import SliceState, SliceTests
from quantdrift.breaker.rules.tolerance import (
    Tolerance,
    ToleranceState,
    active_signals,
    signal_arl,
    summary,
)
from quantdrift.breaker.rules.window import Window, WindowState
from quantdrift.detectors.noise_floor import NoiseFloor
from quantdrift.detectors.sequential import ECusum, ECusumState

__all__ = [
    "Fired",
    "HalfOpenProbe",
    "Pair",
    "RuleStates",
    "active_signals",
    "closed_rules",
    "read",
    "run",
    "signal_arl",
    "similarity_of",
    "summary",
]

S = TypeVar("S")


class Rule(Protocol[S]):
    def init(self) -> S: ...

    def update(self, state: S, pair: Pair) -> tuple[S, Fired | None]: ...


@dataclass(frozen=True, slots=True)
class RuleStates:
    """A route's evidence: each rule's state under the rule's name."""

    consecutive: ConsecutiveState = field(default_factory=ConsecutiveState)
    window: WindowState = field(default_factory=WindowState)
    sequential: ECusumState = field(default_factory=ECusumState)
    tolerance: ToleranceState = field(default_factory=ToleranceState)
    half_open: ProbeState = field(default_factory=ProbeState)
    slices: SliceState = field(default_factory=SliceState)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RuleStates:
        """From ``RouteState.to_json()["rules"]`` (``asdict`` of this class)."""
        data = data or {}
        window = (data.get("window") or {}).get("entries", ())
        tolerance = data.get("tolerance") or {}
        return cls._of(
            consecutive=(data.get("consecutive") or {}).get("n", 0),
            window=window,
            seq=data.get("sequential") or {},
            tests=tolerance.get("tests"),
            early=tolerance.get("early", ""),
            passes=(data.get("half_open") or {}).get("passes", 0),
            slices=data.get("slices"),
        )

    @classmethod
    def from_flat(cls, data: Mapping[str, Any]) -> RuleStates:
        """From the flat layout Redis held before the rules owned their states (one
        field per rule on ``RouteState``): a deployed route keeps its evidence."""
        return cls._of(
            consecutive=data.get("consecutive_failures", 0),
            window=data.get("window", ()),
            seq={"n": data.get("seq_n", 0), "log_m": data.get("seq_log_m", 0.0)},
            tests=data.get("tests"),
            early=data.get("early", ""),
            passes=data.get("half_open_passes", 0),
        )

    @classmethod
    def _of(
        cls,
        consecutive: int,
        window: Any,
        seq: Mapping[str, Any],
        tests: Mapping[str, Any] | None,
        early: str,
        passes: int,
        slices: Mapping[str, Any] | None = None,
    ) -> RuleStates:
        return cls(
            consecutive=ConsecutiveState(int(consecutive)),
            # Windows written before the teacher-forced column hold two values a pair.
            window=WindowState(
                tuple((w[0], bool(w[1]), w[2] if len(w) > 2 else None) for w in window)
            ),
            sequential=ECusumState(int(seq.get("n", 0)), float(seq.get("log_m", 0.0))),
            tolerance=ToleranceState(
                {str(k): tuple(float(x) for x in v) for k, v in (tests or {}).items()},
                str(early or ""),
            ),
            half_open=ProbeState(int(passes)),
            slices=SliceState.from_json(slices),
        )


def closed_rules(policy: RoutePolicy, noise_floor: NoiseFloor) -> tuple[tuple[str, Rule[Any]], ...]:
    """The rules a closed route runs, by name, in the policy's order (each once)."""
    built: dict[str, Rule[Any]] = {}
    for name in dict.fromkeys(policy.rules):
        if name == "consecutive":
            built[name] = Consecutive(policy.consecutive_failures)
        elif name == "window":
            built[name] = Window(
                size=policy.window_size,
                min_len=min(policy.window_size, policy.min_pairs),
                mean_similarity=policy.window_mean_similarity,
                mean_lexical=policy.window_mean_lexical,
                tf_kl=policy.tf_kl_threshold,
                anomaly_rate=policy.window_anomaly_rate,
            )
        elif name == "sequential":
            arl = signal_arl(policy, "sequential") or 2.0
            built[name] = Sequential(
                ECusum(false_alarm_budget=arl), noise_floor, policy.min_noise_pairs
            )
        else:
            built[name] = Tolerance(policy)
    if "tolerance" in built and policy.slice_dimensions:
        built["slices"] = SliceTests(policy)
    return tuple(built.items())


def run(
    rules: tuple[tuple[str, Rule[Any]], ...], states: RuleStates, pair: Pair
) -> tuple[RuleStates, Fired | None]:
    """Fold ``pair`` into every rule; the first alarm in the rules' order, if any."""
    changes: dict[str, Any] = {}
    first: Fired | None = None
    for name, rule in rules:
        changes[name], fired = rule.update(getattr(states, name), pair)
        if first is None:
            first = fired
    return replace(states, **changes), first
