"""Turn a transition into exactly one signed RouteCommand and one AlertEvent.

Ids are derived from (route, epoch), not random: if a crash makes a worker
send the same outbox twice, gateways drop the command on its epoch and alert
sinks fold the alert on its dedupe key.

A candidate change (``breaker/candidate.py``) queues an alert alone, with no
command: nothing about the route's routing changes, only its evidence. The same
argument holds for it: the alert is queued in the commit that writes the restarted
state and marks its pair seen, so it is queued once; its ids are derived from
(route, pair), so a repeated send folds on its dedupe key. A route still not armed
after ``unarmed_alert_pairs`` shadow pairs (``breaker/readiness.py``) queues its one
alert the same way: the fold sets ``readiness.alerted`` in the commit that queues it.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from quantdrift.breaker.candidate import CandidateChange
from quantdrift.breaker.slice_scope import holds
from quantdrift.breaker.state import RouteState, Transition
from quantdrift.schemas.alert import AlertEvent, Severity
from quantdrift.schemas.command import RouteCommand, SliceHold, SliceSelector
from quantdrift.schemas.signing import CommandSigner

_SEVERITY: dict[tuple[str, str], Severity] = {
    ("closed", "open"): "P1",
    ("half_open", "open"): "P1",
    ("open", "half_open"): "P3",
    ("half_open", "closed"): "P2",
}


@dataclass(frozen=True, slots=True)
class Outbox:
    """A transition's messages: the command, its signed envelope (what travels), the alert;
    and the transition they were built from, for readers of a store's answer (replay's
    trips) that want the rule and the states rather than the wire form."""

    command: RouteCommand
    sealed: bytes
    alert: AlertEvent
    transition: Transition

    def items(self) -> tuple[bytes, ...]:
        """The outbox list entries, in publication order: the command first."""
        return (
            orjson.dumps({"topic": "control", "value": self.sealed.decode()}),
            alert_item(self.alert),
        )


def alert_item(alert: AlertEvent) -> bytes:
    """The outbox list entry of an alert (the relay sends it to the alerts topic)."""
    return orjson.dumps({"topic": "alerts", "value": alert.dumps().decode()})


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """One queued message: ``topic`` is ``control`` or ``alerts``."""

    topic: str
    value: bytes
    route: str

    @classmethod
    def parse(cls, raw: bytes | str, route: str) -> OutboxItem:
        data = orjson.loads(raw)
        return cls(data["topic"], data["value"].encode(), route)


def build_outbox(
    route: str,
    transition: Transition,
    state: RouteState,
    signer: CommandSigner,
    now: float,
    source: str = "breaker",
) -> Outbox:
    percent = transition.evidence.get("percent") if transition.action == "canary" else None
    selector = None
    if transition.slice is not None:
        selector = SliceSelector(dimension=transition.slice[0], value=transition.slice[1])
    command = RouteCommand(
        command_id=f"{route}#{state.epoch}",
        route=route,
        action=transition.action,
        percent=percent,
        target=transition.target,
        target_precision=transition.target_precision,
        epoch=state.epoch,
        state=state.state,
        reason=transition.reason,
        evidence=transition.evidence,
        issued_at=now,
        source="manual" if source == "manual" else "breaker",
        locked=state.locked,
        slice=selector,
        slices=tuple(SliceHold.model_validate(h) for h in holds(state)),
    )
    severity = _SEVERITY.get((transition.from_state, transition.to_state), "P2")
    if transition.rule == "manual":
        severity = "P2"
    alert = AlertEvent(
        alert_id=f"{route}#{state.epoch}",
        severity=severity,
        route=route,
        kind=f"breaker.{transition.to_state}",
        summary=(
            f"{route}{'' if selector is None else f' [slice {selector.key}]'}: "
            f"{transition.from_state} -> {transition.to_state} "
            f"({transition.action} to the {transition.target}"
            f"{'' if selector is None else f' for {selector.key} only'}): {transition.reason}"
        ),
        evidence={**transition.evidence, "rule": transition.rule, "epoch": state.epoch},
        ts=now,
        dedupe_key=f"{route}:{transition.to_state}:{state.epoch}",
        epoch=state.epoch,
    )
    return Outbox(command, signer.seal(command), alert, transition)


def change_alert(route: str, change: CandidateChange, state: RouteState, now: float) -> AlertEvent:
    """On-call's notice that a route's candidate changed and its evidence restarted.

    P2: nothing is broken yet, but the route is warming again, so a regression of
    the new build is caught only after ``min_pairs`` of its own pairs; whoever
    rolled it out should know that. The epoch does not move (no command), so the
    ids name the pair that revealed the change.
    """
    return AlertEvent(
        alert_id=f"{route}#candidate#{change.pair_id}",
        severity="P2",
        route=route,
        kind="breaker.candidate_changed",
        summary=(
            f"{route}: the candidate changed ({change.previous} -> {change.current}); "
            f"evidence restarted, the route is warming again ({state.state}, "
            f"serving the {state.target or 'candidate'})"
        ),
        evidence={
            "previous": change.previous,
            "current": change.current,
            "pair_id": change.pair_id,
            "state": state.state,
            "epoch": state.epoch,
        },
        ts=now,
        dedupe_key=f"{route}:candidate_changed:{change.pair_id}",
        epoch=state.epoch,
    )


def not_armed_alert(
    route: str, missing: tuple[str, ...], state: RouteState, pair_id: str, now: float
) -> AlertEvent:
    """On-call's notice that a route is closed and judged, yet a test it relies on
    cannot fire (``breaker/readiness.py``): everything else reading the route would
    otherwise see a quiet, guarded route.

    P2, once per candidate: nothing is broken, but a drift that only those tests see
    would pass. The ids name the pair that crossed ``unarmed_alert_pairs``.
    """
    return AlertEvent(
        alert_id=f"{route}#not_armed#{pair_id}",
        severity="P2",
        route=route,
        kind="breaker.not_armed",
        summary=(
            f"{route}: partly armed after {state.pairs_seen} shadow pairs; "
            f"tests the route relies on cannot fire: {' | '.join(missing)}"
        ),
        evidence={
            "missing": list(missing),
            "pairs_seen": state.pairs_seen,
            "pair_id": pair_id,
            "state": state.state,
            "epoch": state.epoch,
            "candidate_engine": state.candidate_engine,
        },
        ts=now,
        dedupe_key=f"{route}:not_armed:{state.candidate_engine or '-'}",
        epoch=state.epoch,
    )
