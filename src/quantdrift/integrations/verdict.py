"""A route's verdict for a rollout controller, and what each Flagger webhook answers. Pure.

A progressive-delivery controller asks one question per analysis step: may the
candidate go on? The answer comes from the breaker's state for the route, never
from a fresh computation, so the controller and the gateways see one decision:

==========================================  ==============  ==========================
breaker state                               ``verdict``     Argo Rollouts measurement
==========================================  ==============  ==========================
closed, fewer than ``min_pairs`` pairs      inconclusive    Inconclusive (pauses)
closed, partly armed: a test the route      inconclusive    Inconclusive (pauses)
relies on cannot fire (no floor, ...)
closed and armed: every test it relies on   pass            Successful
can fire, none fired
open (tripped or manual rollback)           fail            Failed
half_open (candidate on probation)          fail            Failed
locked by an operator (either side)         fail            Failed
closed, a slice rolled back alone (or       fail            Failed
half-open) by a slice-scoped rollback
==========================================  ==============  ==========================

**Slices.** ``slices`` has one verdict per slice the route has seen
(``breaker/slice_scope.report``): ``fail`` for a slice held apart (rolled back or
half-open: its users are on the reference), ``inconclusive`` for a slice below its
minimum pairs (*insufficient data*, never a pass), else the route's own verdict. The
route's verdict takes its worst slice's ``fail``: a candidate that one language had to
be taken from is not promoted. A slice with insufficient data is inconclusive on its
own row but does not hold the route's verdict back: a rare value (a few pairs of
Korean) would otherwise pause every rollout for good.

*Armed* is the decision core's readiness (``breaker/readiness.py``), read from the
route's state and floors: a route whose divergence tests abstain for want of a
floor is watched by less than its policy says, so no controller may promote it on
that route's silence.

Half-open is a fail: users are on the reference while the candidate proves
itself in shadow, so the route *is* rolled back. A lock is a fail too: an
operator has taken the route from the breaker, so it is not judging the
candidate and cannot vouch for it. Nothing here fails open: a route never seen
is warming (``inconclusive``), and a Redis that cannot be read is an error
(HTTP 503) that the controller counts as such, never a ``pass``.

Flagger reads only the HTTP status of its webhooks; :func:`flagger_answer`
gives each hook type the status whose meaning Flagger documents:

* ``pre-rollout``: 2xx lets traffic reach the canary; here only with a verified
  preflight report for the route (``go`` and two signers).
* ``confirm-promotion``: 2xx promotes; here only when the verdict is ``pass``.
* ``rollback``: 2xx makes Flagger roll the canary back; here when the route is
  rolled back (users on the reference: open, half-open, or an operator's
  rollback). Otherwise 412, and Flagger goes on. An operator's lock on the
  candidate is no rollback (the operator chose the candidate) but still no
  promotion.
* ``event``: always recorded; 2xx once written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from quantdrift.breaker import worst
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.readiness import Readiness, readiness
from quantdrift.breaker.slice_scope import report as slice_report
from quantdrift.breaker.state import RouteState
from quantdrift.detectors.noise_floor import NoiseFloorState
from quantdrift.schemas.command import RouteCommand

Verdict = Literal["pass", "fail", "inconclusive"]
FLAGGER_HOOKS = ("pre-rollout", "confirm-promotion", "rollback", "event")
# Flagger treats any non-2xx as "no"; 412 (Precondition Failed) says why in one word.
NOT_YET = 412


@dataclass(frozen=True, slots=True)
class RouteVerdict:
    """What ``GET /api/v1/routes/{route}/verdict`` answers (``as_json``)."""

    route: str
    verdict: Verdict
    reason: str
    state: str
    target: str
    locked: bool
    epoch: int
    pairs_seen: int
    min_pairs: int
    known: bool
    readiness: Readiness
    last_transition: dict[str, Any] | None = None
    worst_pairs: list[dict[str, Any]] = field(default_factory=list)
    # The route's certificate as checked now (``integrations/certified.py``), if given.
    certificate: dict[str, Any] | None = None
    slices: list[dict[str, Any]] = field(default_factory=list)

    @property
    def armed(self) -> bool:
        """Closed, unlocked, and every test the route relies on can fire."""
        return self.verdict == "pass"

    @property
    def pairs_needed(self) -> int:
        return max(0, self.min_pairs - self.pairs_seen)

    def as_json(self, worst_pairs_url: str) -> dict[str, Any]:
        return {
            "route": self.route,
            "verdict": self.verdict,
            "reason": self.reason,
            "state": self.state,
            "target": self.target,
            "locked": self.locked,
            "epoch": self.epoch,
            "pairs_seen": self.pairs_seen,
            "pairs_needed": self.pairs_needed,
            "min_pairs": self.min_pairs,
            "known": self.known,
            "armed": self.armed,
            **self.readiness.as_json(),
            "last_transition": self.last_transition,
            "worst_pairs": self.worst_pairs,
            "worst_pairs_url": worst_pairs_url,
            **({"certificate": self.certificate} if self.certificate is not None else {}),
            "slices": self.slices,
        }


def last_transition(command: RouteCommand | None) -> dict[str, Any] | None:
    """The rule and evidence of the route's last transition, from its latest signed command.

    A trip's evidence names its rule; the other transitions are named by who made
    them (an operator) or by what they are (the cool-down's probe, its restore).
    """
    if command is None:
        return None
    rule = command.evidence.get("rule")
    if rule is None:
        if command.source == "manual":
            rule = "manual"
        elif command.action == "canary":
            rule = "cooldown"
        elif command.action == "restore":
            rule = "half_open_probe"
    return {
        "action": command.action,
        "target": command.target,
        "rule": rule,
        "reason": command.reason,
        "evidence": command.evidence,
        "epoch": command.epoch,
        "issued_at": command.issued_at,
        "command_id": command.command_id,
        "source": command.source,
    }


def worst_pairs(
    state: RouteState, command: RouteCommand | None, keep: int = 3
) -> list[dict[str, Any]]:
    """The worst pairs since the last transition, else the ones the last trip cited.

    A trip resets the route's counters (and its list of worst pairs), so right
    after a rollback the pairs that caused it live only in the command's evidence.
    """
    if state.worst:
        return worst.evidence(state.worst, keep)
    cited = command.evidence.get("worst_pairs") if command is not None else None
    return [dict(w) for w in cited] if isinstance(cited, list) else []


def route_verdict(
    route: str,
    state: RouteState,
    version: int,
    policy: RoutePolicy,
    command: RouteCommand | None,
    floors: Mapping[str, NoiseFloorState],
) -> RouteVerdict:
    """The verdict for one route (the table in the module docstring); ``floors`` are the
    route's floors by decoding mode (``BreakerStore.read_floors``)."""
    known = version > 0
    ready = readiness(policy, state, floors)
    if state.locked:
        side = "reference" if state.target == "reference" else "candidate"
        verdict: Verdict = "fail"
        reason = f"locked by an operator on the {side}; the breaker is not judging this route"
    elif state.state == "open":
        verdict, reason = "fail", "rolled back: users are on the reference"
    elif state.state == "half_open":
        verdict = "fail"
        reason = "half-open: users are on the reference while the candidate runs in shadow"
    elif not known:
        verdict, reason = "inconclusive", "no shadow pairs seen for this route yet"
    elif not ready.armed:
        verdict, reason = "inconclusive", ready.summary()
    else:
        verdict, reason = "pass", f"closed and {ready.summary()}; no rule fired"
    # Every slice not held apart reads as the route would without the held ones.
    slices = [
        {**row, "verdict": _slice_verdict(row, verdict)} for row in slice_report(policy, state)
    ]
    if state.held and not state.locked and state.state == "closed":
        verdict = "fail"
        reason = "; ".join(
            f"slice {k} {'rolled back' if h.state == 'open' else 'half-open'}: its users are "
            "on the reference, the rest of the route on the candidate"
            for k, h in sorted(state.held.items())
        )
    return RouteVerdict(
        route=route,
        verdict=verdict,
        reason=reason,
        state=state.state,
        target=state.target or "candidate",
        locked=state.locked,
        epoch=state.epoch,
        pairs_seen=state.pairs_seen,
        min_pairs=policy.min_pairs,
        known=known,
        readiness=ready,
        last_transition=last_transition(command),
        worst_pairs=worst_pairs(state, command, policy.worst_pairs_kept),
        slices=slices,
    )


def _slice_verdict(row: Mapping[str, Any], route: Verdict) -> Verdict:
    """One slice's verdict: held apart is a fail, insufficient data inconclusive, and
    otherwise the route's (a slice cannot pass a route that does not).

    >>> _slice_verdict({"status": "rolled_back"}, "fail")
    'fail'
    >>> _slice_verdict({"status": "insufficient_data"}, "pass")
    'inconclusive'
    >>> _slice_verdict({"status": "testing"}, "fail")
    'fail'
    """
    if row["status"] in ("rolled_back", "half_open"):
        return "fail"
    if row["status"] == "insufficient_data" and route == "pass":
        return "inconclusive"
    return route


@dataclass(frozen=True, slots=True)
class HookAnswer:
    """The HTTP status a Flagger webhook returns and the body that explains it."""

    status: int
    body: dict[str, Any]


def flagger_answer(
    hook: str,
    verdict: RouteVerdict,
    preflight_ok: bool | None = None,
    preflight_problems: tuple[str, ...] = (),
) -> HookAnswer:
    """The answer to one Flagger webhook, by its type (rules in the module docstring).

    ``preflight_ok`` is None when no preflight report is configured for the
    route: ``pre-rollout`` then refuses, since nothing verified says the
    candidate may take traffic.
    """
    body: dict[str, Any] = {"hook": hook, "route": verdict.route, "verdict": verdict.verdict}
    if hook == "pre-rollout":
        problems: tuple[str, ...]
        if preflight_ok is None:
            problems = ("no preflight report is configured for this route",)
        else:
            problems = preflight_problems
        ok = bool(preflight_ok)
        return HookAnswer(200 if ok else NOT_YET, {**body, "ok": ok, "problems": list(problems)})
    if hook == "confirm-promotion":
        ok = verdict.verdict == "pass"
        return HookAnswer(200 if ok else NOT_YET, {**body, "ok": ok, "reason": verdict.reason})
    if hook == "rollback":
        roll = verdict.target == "reference"
        return HookAnswer(
            200 if roll else NOT_YET, {**body, "rollback": roll, "reason": verdict.reason}
        )
    raise ValueError(f"unknown Flagger hook {hook!r}; known: {', '.join(FLAGGER_HOOKS)}")
