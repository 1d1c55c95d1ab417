"""The slice rule: the route's tests again, per value of each tag dimension, inside its budget.

Quantization harm concentrates (long inputs, one script, JSON): a drift confined to
a slice at 10 % of the traffic is diluted tenfold in the route's aggregate tests.
:class:`SliceTests` runs, for every value of every dimension the policy names
(``slice_dimensions``: ``language``, ``length``, ``output`` by default), the
tolerance tests of :data:`~quantdrift.breaker.rules.tolerance.SLICE_SIGNALS` on
that value's pairs only, each at :func:`~quantdrift.breaker.rules.tolerance.slice_arl`.

* **Values.** A pair's value is its tag (``ScoreEvent.tags``); a pair without the
  tag is ``other``. Each dimension admits at most ``slice_max_values`` values, the
  first ones the route sees, ``other`` included; every later value pools into
  ``other``. The admitted values are state, so a route's slices do not move.
* **Insufficient data.** A value below ``slice_min_pairs`` pairs cannot roll the
  route back: its test runs (its evidence is kept) and a crossing waits, like the
  aggregate's before ``min_pairs``, until the slice has its pairs. The status shows
  it as ``insufficient data``, never as a pass (:func:`report`).
* **Budget.** Aggregate and slices share the route's one budget (docs/deciding.md,
  "Slices": the split and why the false-rollback probability stays within it).

Pure: state in, state out (:class:`SliceState`, a JSON value in ``RouteState``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules.reading import Fired, Pair
from quantdrift.breaker.rules.tolerance import slice_arl, slice_signals, step, summary

OTHER = "other"
INSUFFICIENT = "insufficient_data"
TESTING = "testing"


def slice_key(dimension: str, value: str) -> str:
    """How a slice is named in state, alerts and status.

    >>> slice_key("language", "zh")
    'language=zh'
    """
    return f"{dimension}={value}"


@dataclass(frozen=True, slots=True)
class SliceState:
    """Per dimension, the values admitted (in order); per slice (``dim=value``): its
    pairs, its tests' states (as the tolerance rule keeps them) and, when a test crossed
    before the slice had ``slice_min_pairs``, that signal (``early``)."""

    values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pairs: dict[str, int] = field(default_factory=dict)
    tests: dict[str, dict[str, tuple[float, ...]]] = field(default_factory=dict)
    early: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> SliceState:
        data = data or {}
        return cls(
            values={
                str(k): tuple(str(x) for x in v) for k, v in (data.get("values") or {}).items()
            },
            pairs={str(k): int(v) for k, v in (data.get("pairs") or {}).items()},
            tests={
                str(k): {str(s): tuple(float(x) for x in t) for s, t in v.items()}
                for k, v in (data.get("tests") or {}).items()
            },
            early={str(k): str(v) for k, v in (data.get("early") or {}).items()},
        )


def value_of(
    state: SliceState, policy: RoutePolicy, dimension: str, tags: Mapping[str, str]
) -> tuple[str, tuple[str, ...]]:
    """The pair's value in ``dimension`` and the dimension's admitted values after it.

    >>> p = RoutePolicy(slice_max_values=3)
    >>> s = SliceState(values={"language": ("en", "zh")})
    >>> value_of(s, p, "language", {"language": "zh"})
    ('zh', ('en', 'zh'))
    >>> value_of(s, p, "language", {"language": "ja"})  # two values and "other": full
    ('other', ('en', 'zh'))
    >>> value_of(SliceState(), p, "language", {})
    ('other', ())
    """
    admitted = state.values.get(dimension, ())
    value = tags.get(dimension) or OTHER
    if value == OTHER or value in admitted:
        return value, admitted
    if len(admitted) < policy.slice_max_values - 1:  # one place stays for "other"
        return value, (*admitted, value)
    return OTHER, admitted


@dataclass(frozen=True, slots=True)
class SliceTests:
    """Every slice's tests on the route's budget; alarms on the first slice (in the
    policy's dimension order) whose test crossed with enough pairs, else on one kept
    in ``early`` that now has them."""

    policy: RoutePolicy

    def init(self) -> SliceState:
        return SliceState()

    def update(self, state: SliceState, pair: Pair) -> tuple[SliceState, Fired | None]:
        policy = self.policy
        signals = slice_signals(policy)
        if not signals:
            return state, None
        arls = {s: a for s in signals if (a := slice_arl(policy, s)) is not None}
        values, pairs = dict(state.values), dict(state.pairs)
        tests, early = dict(state.tests), dict(state.early)
        fired: Fired | None = None
        for dimension in policy.slice_dimensions:
            value, values[dimension] = value_of(state, policy, dimension, pair.score.tags)
            key = slice_key(dimension, value)
            pairs[key] = pairs.get(key, 0) + 1
            tests[key], crossed = step(policy, tests.get(key, {}), pair, arls)
            if crossed and key not in early:
                early[key] = crossed[0].signal
            if fired is not None or pairs[key] < policy.slice_min_pairs:
                continue
            if crossed:
                first = crossed[0]
                evidence = {**first.evidence, "tests": summary(tests[key])}
                fired = _fired(dimension, value, pairs[key], first.signal, first.reason, evidence)
            elif key in early:
                signal = early[key]
                reason = f"{signal}: crossed before the slice had {policy.slice_min_pairs} pairs"
                evidence = {"signal": signal, "early": True, "tests": summary(tests[key])}
                fired = _fired(dimension, value, pairs[key], signal, reason, evidence)
        return SliceState(values, pairs, tests, early), fired


def _fired(
    dimension: str, value: str, pairs: int, signal: str, reason: str, evidence: dict[str, Any]
) -> Fired:
    key = slice_key(dimension, value)
    return Fired(
        f"tolerance:{signal}@{key}",
        f"slice {key}: {reason}",
        {**evidence, "slice": {"dimension": dimension, "value": value, "pairs": pairs}},
    )


def report(policy: RoutePolicy, state: SliceState) -> list[dict[str, Any]]:
    """One row per slice a route has seen, for ``route status``: its pairs and whether it
    is ``insufficient_data`` (below ``slice_min_pairs``: never a pass) or ``testing``.

    >>> p = RoutePolicy(slice_min_pairs=20, slice_dimensions=("language",))
    >>> [(r["slice"], r["status"]) for r in report(p, SliceState(
    ...     values={"language": ("en", "zh")}, pairs={"language=en": 40, "language=zh": 3}))]
    [('language=en', 'testing'), ('language=zh', 'insufficient_data')]
    """
    rows = []
    for dimension in policy.slice_dimensions:
        for value in (*state.values.get(dimension, ()), OTHER):
            key = slice_key(dimension, value)
            n = state.pairs.get(key, 0)
            if n == 0 and value == OTHER:
                continue
            rows.append(
                {
                    "slice": key,
                    "dimension": dimension,
                    "value": value,
                    "pairs": n,
                    "min_pairs": policy.slice_min_pairs,
                    "status": INSUFFICIENT if n < policy.slice_min_pairs else TESTING,
                    "early": state.early.get(key),
                    "tests": summary(state.tests.get(key, {})),
                }
            )
    return rows
