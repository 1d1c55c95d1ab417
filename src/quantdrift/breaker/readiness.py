"""Which of a route's tests can fire, and why the others abstain. Pure.

"Closed, ``min_pairs`` seen" does not make a route guarded: a divergence test with
no floor to compare with abstains on every pair (``rules/tolerance.py``), and a
route whose teacher-forced KL, cosine and ROUGE-L tests all abstain is watched by
its hard-failure and outcome tests alone. So a route is **armed** only when every
test its policy relies on can fire; otherwise it is *partly armed* (or *warming*,
below ``min_pairs``), and the missing parts are named. Route status, the verdict
API, the status page, preflight and the OpenTelemetry events all read this one
answer.

Per rule of the policy (the tolerance rule's tests as ``tolerance:<signal>``), in
the order the judge runs them:

===================  =====================================================================
rule                 can fire when
===================  =====================================================================
consecutive, window  ``min_pairs`` shadow pairs seen
tolerance:hard       ``min_pairs`` seen (its null is ``tolerance_hard``, or a blessed rate)
tolerance:outcomes   ``min_pairs`` seen (paired: the reference's failures cancel)
tolerance:<div>      ``min_pairs`` seen, the pairs carry the divergence (``tf_kl``: teacher-
                     forced log-probs; ``entropy``: per-token logprobs; ``dissimilarity``:
                     an embedder's cosine; ``lexical``: ROUGE-L), and, for every decoding
                     mode the route's pairs come in, a floor of ``min_floor_pairs`` values
                     that vary (a blessed baseline, else noise pairs: the judge's own
                     ``detectors.tolerance.informative``)
sequential           ``min_pairs`` seen, and per mode ``min_noise_pairs`` noise values of
                     some metric that vary
===================  =====================================================================

An abstention says why, in one of these words (``missing``): ``min_pairs``,
``floor`` (k of n noise pairs), ``blessing`` (a greedy floor, or one that never
varies, needs a blessed baseline), ``teacher_forcing`` (the pool's pairs carry no
teacher-forced log-probs, or the policy turned it off), ``logprobs``, ``embedder``,
``evidence`` (no ROUGE-L: empty answers).

Which tests a route *relies on* is ``RoutePolicy.relies_on``, or by default: every
rule the policy lists, and of the tolerance rule its hard and outcome tests plus
each divergence test whose evidence the route's pairs carry. What the pairs carry
and in which modes they come is not in any floor, so the fold keeps it
(:func:`observe`, into ``RouteState.readiness``), and reports there, once, the tests
that abstain for want of a floor and, after ``unarmed_alert_pairs`` shadow pairs of
a candidate still not armed, the one P2 alert (``outbox.not_armed_alert``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules.tolerance import aggregate_arls, signal_arl
from quantdrift.breaker.state import RouteState
from quantdrift.detectors.noise_floor import FLOOR_METRICS, NoiseFloorState, resolution
from quantdrift.detectors.tolerance import (
    BLESSED,
    DIVERGENCES,
    SIGNALS,
    BettingState,
    informative,
)
from quantdrift.schemas.score import Metrics, ScoreEvent

Missing = Literal[
    "min_pairs", "floor", "blessing", "teacher_forcing", "logprobs", "embedder", "evidence"
]
# A floor's abstention: what the log-once notice and the gateway's noise share act on.
FLOORLESS: tuple[Missing, ...] = ("floor", "blessing")
# The floor metric each divergence test compares with (detectors.tolerance.floor_metric).
FLOOR_METRIC = {
    "tf_kl": "tf_kl",
    "dissimilarity": "cosine",
    "lexical": "rougeL",
    "entropy": "abs_entropy_shift",
}
# Why a divergence test has nothing to test when no pair carried its evidence.
_NOT_CARRIED: dict[str, tuple[Missing, str]] = {
    "tf_kl": (
        "teacher_forcing",
        "no teacher forcing on this pool: its pairs carry no teacher-forced logprobs",
    ),
    "entropy": ("logprobs", "no logprobs: the pairs carry no per-token entropy"),
    "dissimilarity": ("embedder", "no embedder: the pairs carry no cosine similarity"),
    "lexical": ("evidence", "the pairs carry no ROUGE-L (empty answers)"),
}


@dataclass(frozen=True, slots=True)
class Abstention:
    """One reason a test cannot fire: the missing part, in words a user acts on."""

    missing: Missing
    reason: str


@dataclass(frozen=True, slots=True)
class RuleReadiness:
    """One test of the route: can it fire, and if not, why not."""

    rule: str
    relied_on: bool
    abstentions: tuple[Abstention, ...] = ()

    @property
    def can_fire(self) -> bool:
        return not self.abstentions

    @property
    def status(self) -> str:
        return "can_fire" if self.can_fire else "abstains"

    def explain(self, skip: Sequence[Missing] = ()) -> str:
        """``rule: reason; reason`` (without the ``skip`` kinds of abstention)."""
        reasons = [a.reason for a in self.abstentions if a.missing not in skip]
        return f"{self.rule}: {'; '.join(reasons)}" if reasons else self.rule

    def as_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "status": self.status,
            "relied_on": self.relied_on,
            "missing": [a.missing for a in self.abstentions],
            "reasons": [a.reason for a in self.abstentions],
        }


@dataclass(frozen=True, slots=True)
class Readiness:
    """Every test of a route with its readiness; ``armed`` when every relied-on one can fire."""

    rules: tuple[RuleReadiness, ...]
    pairs_seen: int
    min_pairs: int
    modes: tuple[str, ...]

    @property
    def armed(self) -> bool:
        return all(r.can_fire for r in self.rules if r.relied_on)

    @property
    def warming(self) -> bool:
        return self.pairs_seen < self.min_pairs

    @property
    def label(self) -> str:
        """``armed``, ``warming`` (below ``min_pairs``) or ``partly armed``."""
        if self.armed:
            return "armed"
        return "warming" if self.warming else "partly armed"

    @property
    def missing(self) -> tuple[str, ...]:
        """Each relied-on test that abstains for more than ``min_pairs``, with why."""
        return tuple(
            r.explain(skip=("min_pairs",))
            for r in self.rules
            if r.relied_on and any(a.missing != "min_pairs" for a in r.abstentions)
        )

    def summary(self) -> str:
        """One line for route status and the verdict API's reason."""
        if self.armed:
            fire = sum(r.can_fire for r in self.rules)
            return (
                f"armed: {self.pairs_seen} shadow pairs; every test the route relies on "
                f"can fire ({fire} of {len(self.rules)} tests)"
            )
        parts = []
        if self.warming:
            parts.append(f"warming: {self.pairs_seen} of {self.min_pairs} shadow pairs seen")
        else:
            parts.append(f"partly armed: {self.pairs_seen} shadow pairs")
        if self.missing:
            parts.append("abstaining: " + " | ".join(self.missing))
        return "; ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {
            "readiness": self.label,
            "armed": self.armed,
            "missing": list(self.missing),
            "modes": list(self.modes),
            "rules": [r.as_json() for r in self.rules],
        }


def rule_names(policy: RoutePolicy) -> tuple[str, ...]:
    """The route's tests, in the order the judge runs them (each once)."""
    names: list[str] = []
    for rule in dict.fromkeys(policy.rules):
        if rule == "tolerance":
            names += [f"tolerance:{s}" for s in SIGNALS if signal_arl(policy, s) is not None]
        else:
            names.append(rule)
    return tuple(names)


def relied_on(policy: RoutePolicy, rule: str, carried: Mapping[str, int]) -> bool:
    """Whether the route must be able to run ``rule`` to be armed (module docstring)."""
    bare = rule.removeprefix("tolerance:")
    if policy.relies_on is not None:
        return bare in policy.relies_on
    if bare in DIVERGENCES:
        return carried.get(bare, 0) > 0
    return True


def carries(policy: RoutePolicy, signal: str, m: Metrics) -> bool:
    """Whether a shadow pair carries what the divergence test ``signal`` needs."""
    if signal == "tf_kl":
        return policy.teacher_forced and m.tf_kl is not None
    if signal == "dissimilarity":
        return m.cosine is not None
    if signal == "lexical":
        return m.rougeL is not None
    return m.entropy_shift is not None


def route_modes(state: RouteState, floors: Mapping[str, NoiseFloorState]) -> tuple[str, ...]:
    """The decoding modes a route is judged in: those of its pairs, else of its floors,
    else ``sampled`` (unknown decoding counts as sampled)."""
    seen = tuple(sorted(m for m, n in state.readiness.modes.items() if n > 0))
    if seen:
        return seen
    floored = tuple(sorted(m for m, f in floors.items() if f.values))
    return floored or ("sampled",)


def readiness(
    policy: RoutePolicy,
    state: RouteState,
    floors: Mapping[str, NoiseFloorState],
    modes: Sequence[str] | None = None,
) -> Readiness:
    """Each test of the route's policy: can it fire, given its state and floors?

    ``floors`` by decoding mode (a missing one is empty); ``modes`` the modes to judge
    (default: :func:`route_modes`).
    """
    modes = tuple(modes) if modes is not None else route_modes(state, floors)
    carried = state.readiness.carried
    warming = (
        (Abstention("min_pairs", f"below min_pairs: {state.pairs_seen} of {policy.min_pairs}"),)
        if state.pairs_seen < policy.min_pairs
        else ()
    )
    rows = []
    for rule in rule_names(policy):
        found = warming + _abstentions(policy, rule, state, floors, modes)
        rows.append(RuleReadiness(rule, relied_on(policy, rule, carried), found))
    return Readiness(tuple(rows), state.pairs_seen, policy.min_pairs, modes)


def _abstentions(
    policy: RoutePolicy,
    rule: str,
    state: RouteState,
    floors: Mapping[str, NoiseFloorState],
    modes: Sequence[str],
) -> tuple[Abstention, ...]:
    empty = NoiseFloorState()
    if rule == "sequential":
        return tuple(
            a
            for mode in modes
            if (a := _sequential_floor(policy, floors.get(mode, empty), mode)) is not None
        )
    signal = rule.removeprefix("tolerance:")
    if signal not in DIVERGENCES:
        return ()  # consecutive, window, hard, outcomes: min_pairs alone
    if signal == "tf_kl" and not policy.teacher_forced:
        return (Abstention("teacher_forcing", "teacher forcing is off in the route's policy"),)
    found: list[Abstention] = []
    if state.pairs_seen > 0 and state.readiness.carried.get(signal, 0) == 0:
        missing, reason = _NOT_CARRIED[signal]
        found.append(Abstention(missing, reason))
    for mode in modes:
        a = _divergence_floor(policy, FLOOR_METRIC[signal], floors.get(mode, empty), mode)
        if a is not None:
            found.append(a)
    return tuple(found)


def _divergence_floor(
    policy: RoutePolicy, metric: str, floor: NoiseFloorState, mode: str
) -> Abstention | None:
    """None when the floor the judge would use (blessed, else noise) is informative."""
    need = policy.min_floor_pairs
    blessed = floor.values.get(BLESSED + metric, ())
    noise = floor.values.get(metric, ())
    if informative(blessed, metric, need) or informative(noise, metric, need):
        return None
    if len(noise) >= need or mode == "greedy":
        # Greedy reference runs agree token for token (their echoes never reach a
        # floor), and a floor that never varies says nothing: bless a candidate.
        return Abstention(
            "blessing",
            f"no blessing: {len(noise)} {mode} noise pairs with {metric} and no spread "
            f"among them; a {mode} floor needs a blessed baseline of {need} pairs "
            "(quantdrift calibrate --blessed-label)",
        )
    return Abstention("floor", f"no floor: {len(noise)} of {need} {mode} noise pairs")


def _sequential_floor(policy: RoutePolicy, floor: NoiseFloorState, mode: str) -> Abstention | None:
    """None when some metric has ``min_noise_pairs`` noise values that vary (p_value's test)."""
    need = policy.min_noise_pairs
    best = 0
    for metric in FLOOR_METRICS:
        values = floor.values.get(metric, ())
        if len(values) >= need and max(values) - min(values) >= resolution(metric):
            return None
        best = max(best, len(values))
    return Abstention("floor", f"no floor: {best} of {need} {mode} noise pairs")


@dataclass(frozen=True, slots=True)
class Observed:
    """What one shadow pair told the readiness check.

    ``notices``: relied-on tests found abstaining for want of a floor for the first
    time on this route ("rule: reason"), for the worker to log once; ``not_armed``:
    the relied-on tests still abstaining when this pair crossed ``unarmed_alert_pairs``
    (the one P2 alert of this candidate), else empty.
    """

    notices: tuple[str, ...] = ()
    not_armed: tuple[str, ...] = ()


def observe(
    policy: RoutePolicy, state: RouteState, score: ScoreEvent, floor: NoiseFloorState | None
) -> tuple[RouteState, Observed]:
    """Fold one judged shadow pair into the route's readiness record (``state`` is the
    judge's answer for it; ``floor`` the floor of the pair's decoding mode)."""
    seen = state.readiness
    carried = dict(seen.carried)
    for signal in DIVERGENCES:
        if carries(policy, signal, score.metrics):
            carried[signal] = carried.get(signal, 0) + 1
    modes = {**seen.modes, score.decoding: seen.modes.get(score.decoding, 0) + 1}
    state = state.evolve(readiness=replace(seen, carried=carried, modes=modes))
    floors: dict[str, NoiseFloorState] = {score.decoding: floor} if floor is not None else {}
    ready = readiness(policy, state, floors, modes=(score.decoding,))
    fresh = [
        r
        for r in ready.rules
        if r.relied_on
        and r.rule not in seen.noted
        and any(a.missing in FLOORLESS for a in r.abstentions)
    ]
    notices = tuple(r.explain(skip=("min_pairs",)) for r in fresh)
    alert = (
        not seen.alerted
        and bool(ready.missing)
        and state.state == "closed"
        and not state.locked
        and state.pairs_seen >= max(policy.unarmed_alert_pairs, policy.min_pairs)
    )
    record = replace(
        state.readiness,
        missing=ready.missing,
        armed=ready.armed,
        noted=seen.noted + tuple(r.rule for r in fresh),
        alerted=seen.alerted or alert,
    )
    return state.evolve(readiness=record), Observed(notices, ready.missing if alert else ())


def sureness(policy: RoutePolicy, state: RouteState) -> RouteState:
    """Record how sure the route's evidence is, for gateways' adaptive share.

    ``progress``: the largest, over the tolerance tests, of the test's log e-statistic
    over its threshold (``log`` of its run length), clipped to 0..1: near 1, a test is
    close to firing and more pairs settle it sooner. ``short_slices``: slice values the
    policy judges that still have fewer than ``slice_min_pairs`` pairs (insufficient
    data), of ``slices`` judged. Pure; written into ``RouteState.readiness`` after each
    shadow pair's fold.
    """
    arls = aggregate_arls(policy)
    progress = 0.0
    for signal, raw in state.rules.tolerance.tests.items():
        arl = arls.get(signal)
        test = BettingState.from_json(raw)
        if arl is None or arl <= 1 or not test.log_r:
            continue
        progress = max(progress, max(test.log_r) / math.log(arl))
    pairs = state.rules.slices.pairs
    short = sum(1 for n in pairs.values() if n < policy.slice_min_pairs)
    record = replace(
        state.readiness,
        progress=round(min(1.0, max(0.0, progress)), 4),
        short_slices=short,
        slices=len(pairs),
    )
    return state.evolve(readiness=record)
