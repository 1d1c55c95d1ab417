"""Slice-scoped rollback: a breaker per slice inside its route's state. Pure.

With ``rollback_scope: slice`` a slice's alarm (``rules/slices.py``) rolls back only
that slice: its requests go to the reference and the rest of the route stays on the
candidate. The slice then lives its own breaker life in ``RouteState.held``:

* **open**: its pairs should not come (the gateway runs no candidate for it); those
  still in flight from before the trip say nothing new and are ignored. A *failing*
  pair built more than ``slice_stray_grace_s`` after the trip is not in flight: some
  gateway still runs the candidate for the slice (one that cannot map the selector
  refuses the command), so the rollback widens to the route.
* **half-open** after its cool-down (:func:`tick`): the reference serves the slice and
  the candidate runs in shadow for it; its pairs go to the half-open probe, not to
  the route's rules. ``half_open_pairs`` passing pairs restore it (it leaves
  ``held``), one failing pair re-opens it with a longer cool-down.
* **Widening.** A slice that trips ``widen_after_trips`` times (its first trip and each
  failed probe), a ``widen_after_slices``-th slice, and a pooled ``other`` slice (no
  gateway can match "every value not admitted") roll the whole route back instead
  (:class:`Widen`, which the machine turns into its route trip; a route trip holds no
  slices).

Every slice transition bumps the route's one epoch (gateways fence per route) and
yields one transition, so the outbox's rule holds unchanged: one command and one
alert per transition. The command carries the slice's selector and every slice held
after it (``schemas/command.py``), so the latest command alone says where each slice
goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from quantdrift.breaker import worst
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules import RuleStates
from quantdrift.breaker.rules.probe import HalfOpenProbe, ProbeState
from quantdrift.breaker.rules.reading import Fired, Pair
from quantdrift.breaker.rules.slices import OTHER, SliceState
from quantdrift.breaker.rules.slices import report as slice_report
from quantdrift.breaker.state import (
    Decision,
    HeldSlice,
    RouteState,
    Transition,
    next_epoch,
    target_hint,
)


@dataclass(frozen=True, slots=True)
class Widen:
    """A slice-scoped rollback that must become the route's: why, for the route's trip."""

    rule: str
    reason: str
    evidence: dict[str, Any]


def holding(state: RouteState, tags: Mapping[str, str]) -> HeldSlice | None:
    """The held slice a pair with ``tags`` belongs to, if any (the first, by key).

    >>> s = RouteState(held={"language=zh": HeldSlice("language", "zh")})
    >>> holding(s, {"language": "zh"}).key, holding(s, {"language": "en"})
    ('language=zh', None)
    """
    for key in sorted(state.held):
        held = state.held[key]
        if tags.get(held.dimension) == held.value:
            return held
    return None


def scoped_slice(policy: RoutePolicy, fired: Fired) -> tuple[str, str] | None:
    """The slice an alarm may roll back alone: a slice rule's, under ``rollback_scope:
    slice``; None rolls the route back."""
    found = fired.evidence.get("slice")
    if policy.rollback_scope != "slice" or not isinstance(found, dict):
        return None
    return str(found["dimension"]), str(found["value"])


def trip(
    policy: RoutePolicy,
    state: RouteState,
    where: tuple[str, str],
    fired: Fired,
    numbers: dict[str, Any],
    now: float,
) -> Decision | Widen:
    """A closed slice's alarm: hold the slice open, or widen to the route."""
    dimension, value = where
    key = f"{dimension}={value}"
    why = None
    if value == OTHER:
        why = f"slice {key} pools every value not admitted: no gateway can match it"
    elif len(state.held) + 1 >= policy.widen_after_slices:
        why = f"{len(state.held) + 1} slices would be rolled back (widen_after_slices)"
    if why is not None:
        return Widen(fired.rule, f"{fired.reason}; widened to the route: {why}", numbers)
    held = HeldSlice(dimension, value, "open", now, policy.cooldown_s, 1, 0)
    return _open(policy, state, held, "closed", fired.rule, fired.reason, numbers, now)


def judge_held(
    policy: RoutePolicy, state: RouteState, held: HeldSlice, pair: Pair
) -> Decision | Widen:
    """A pair of a held slice: ignored while it is open (unless it is a failing stray:
    see the module docstring), the probe's while half-open."""
    if held.state == "open":
        late = pair.score.ts - held.opened_at
        if pair.failing and late > policy.slice_stray_grace_s:
            reason = (
                f"slice {held.key}: a failing candidate pair made {late:.1f} s after the "
                "slice's rollback: a gateway still serves the slice from the "
                "candidate; widened to the route"
            )
            evidence: dict[str, Any] = {"decisive_pair_id": pair.score.pair_id, "slice": _row(held)}
            return Widen(f"stray@{held.key}", reason, evidence)
        return Decision(state.evolve(last_decision=f"ignored@{held.key}"))
    probe = HalfOpenProbe(policy.half_open_pairs)
    passed, fired = probe.update(ProbeState(held.passes), pair)
    now = state.updated_at
    if fired is not None:
        trips = held.trips + 1
        if trips >= policy.widen_after_trips:
            reason = (
                f"slice {held.key}: {fired.reason}; widened to the route: the slice tripped "
                f"{trips} times (widen_after_trips)"
            )
            evidence = {**fired.evidence, "slice": _row(held)}
            return Widen(f"{fired.rule}@{held.key}", reason, evidence)
        cooldown = min(held.cooldown_s * policy.cooldown_backoff, policy.max_cooldown_s)
        again = replace(
            held, state="open", opened_at=now, cooldown_s=cooldown, trips=trips, passes=0
        )
        return _open(
            policy, state, again, "half_open", f"{fired.rule}@{held.key}",
            f"slice {held.key}: {fired.reason}", fired.evidence, now,
        )  # fmt: skip
    if not probe.proven(passed):
        probing = replace(held, passes=passed.passes)
        held_now = {**state.held, held.key: probing}
        return Decision(state.evolve(held=held_now, last_decision=f"probe_pass@{held.key}"))
    rest = {k: v for k, v in state.held.items() if k != held.key}
    new = state.evolve(
        held=rest,
        epoch=next_epoch(state.epoch, now),
        rules=forget(state.rules, held.key),
        last_decision=f"restored@{held.key}",
    )
    reason = f"slice {held.key}: {passed.passes} passing shadow pairs in half-open"
    evidence = {"passes": passed.passes, "slice": _row(held)}
    return Decision(
        new,
        Transition(
            "half_open", "closed", "restore", "candidate", "half_open_probe", reason, evidence,
            target_hint(policy, "candidate"), (held.dimension, held.value),
        ),
    )  # fmt: skip


def tick(policy: RoutePolicy, state: RouteState, now: float) -> Decision | None:
    """The first open slice (by key) whose cool-down is over goes half-open; None: none.

    One a call, so one commit carries one command; the next tick takes the next slice.
    """
    for key in sorted(state.held):
        held = state.held[key]
        if held.state != "open" or now - held.opened_at < held.cooldown_s:
            continue
        probing = replace(held, state="half_open", passes=0)
        new = state.evolve(
            held={**state.held, key: probing},
            epoch=next_epoch(state.epoch, now),
            last_decision=f"half_open@{key}",
            updated_at=now,
        )
        reason = f"slice {key}: cool-down of {held.cooldown_s:g} s over: candidate runs in shadow"
        evidence = {"cooldown_s": held.cooldown_s, "percent": 0.0, "slice": _row(probing)}
        return Decision(
            new,
            Transition(
                "open", "half_open", "canary", "reference", "cooldown", reason, evidence,
                target_hint(policy, "reference"), (held.dimension, held.value),
            ),
        )  # fmt: skip
    return None


def forget(rules: RuleStates, key: str) -> RuleStates:
    """The route's evidence after a slice transition: the aggregate tests restart (they
    hold the slice's failing pairs, which would otherwise roll the whole route back
    next), the slice's own tests restart, and every other slice keeps its evidence."""
    slices = rules.slices
    kept = SliceState(
        values=slices.values,
        pairs={k: v for k, v in slices.pairs.items() if k != key},
        tests={k: v for k, v in slices.tests.items() if k != key},
        early={k: v for k, v in slices.early.items() if k != key},
    )
    return RuleStates(slices=kept)


def holds(state: RouteState) -> list[dict[str, Any]]:
    """Every held slice as a command's ``slices`` entry (``schemas.command.SliceHold``)."""
    return [
        {
            "dimension": h.dimension,
            "value": h.value,
            "action": "rollback" if h.state == "open" else "canary",
            "target": "reference",
            "percent": 0.0 if h.state == "half_open" else None,
        }
        for _, h in sorted(state.held.items())
    ]


def _open(
    policy: RoutePolicy,
    state: RouteState,
    held: HeldSlice,
    from_state: str,
    rule: str,
    reason: str,
    numbers: dict[str, Any],
    now: float,
) -> Decision:
    evidence = {
        **numbers,
        "rule": rule,
        "pairs_seen": state.pairs_seen,
        "cooldown_s": held.cooldown_s,
        "slice": {**(numbers.get("slice") or {}), **_row(held)},
        "worst_pairs": worst.evidence(
            state.worst, policy.worst_pairs_kept, (held.dimension, held.value)
        ),
    }
    new = state.evolve(
        held={**state.held, held.key: held},
        epoch=next_epoch(state.epoch, now),
        rules=forget(state.rules, held.key),
        worst=(),
        last_decision=f"trip:{rule}",
    )
    return Decision(
        new,
        Transition(
            from_state,  # type: ignore[arg-type]  # "closed" or "half_open"
            "open", "rollback", "reference", rule, reason, evidence,
            target_hint(policy, "reference"), (held.dimension, held.value),
        ),
    )  # fmt: skip


def _row(held: HeldSlice) -> dict[str, Any]:
    return {
        "dimension": held.dimension,
        "value": held.value,
        "key": held.key,
        "state": held.state,
        "trips": held.trips,
    }


def report(policy: RoutePolicy, state: RouteState) -> list[dict[str, Any]]:
    """``rules/slices.report`` (each slice's pairs, ``testing`` or ``insufficient_data``)
    with each slice's own breaker: ``breaker`` is ``closed``, ``open`` or ``half_open``
    and ``status`` says ``rolled_back`` / ``half_open`` for a held slice (whose tests
    restarted, so its pair count says nothing about it). A held slice on a dimension
    the policy no longer judges still gets its row: its users are on the reference."""
    rows = slice_report(policy, state.rules.slices)
    seen = {r["slice"] for r in rows}
    for key, held in sorted(state.held.items()):
        if key not in seen:
            rows.append(
                {"slice": key, "dimension": held.dimension, "value": held.value, "pairs": 0,
                 "min_pairs": policy.slice_min_pairs, "early": None, "tests": {}}
            )  # fmt: skip
    for row in rows:
        holding = state.held.get(row["slice"])
        row["breaker"] = "closed" if holding is None else holding.state
        if holding is not None:
            row["status"] = "rolled_back" if holding.state == "open" else "half_open"
            row["trips"] = holding.trips
            row["cooldown_s"] = holding.cooldown_s
    return rows
