"""A route's breaker state rebuilt from its newest command, after Redis lost its data.

Why: a Redis that comes back empty while a route is rolled back forgets the route:
its state and the ``routes`` set that the clock ticks. The gateways keep the rollback
(the control topic says so), and with the candidate suspended they send no pair that
could bring the route back. Without this the route stays on the reference for good,
no half-open ever comes, and ``route status`` no longer lists it (found by the fault
rig's ``redis-restart-open`` case).

The control topic is the durable record: each route's newest verified command says
what the breaker last decided. Only what keeps users off the candidate is rebuilt
(open, half-open, a lock); a closed route needs nothing, its empty state is closed.
The epoch is the command's, so the next transition is newer than what the gateways
applied; the cool-down runs from the command's ``issued_at``.

Only a state older than the command is rebuilt (its epoch below the command's): a
pair still in flight when Redis came back empty may already have folded into a
fresh closed state (epoch 0), and that state must not stand; a transition made after
the loss has a newer epoch (the hybrid clock, ``machine.next_epoch``) and stands.

Pure: the worker's judge stage reads the topic and writes the state
(``streams/judge_stage.py``) with one compare-and-set.
"""

from __future__ import annotations

from collections.abc import Iterable

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules import RuleStates
from quantdrift.breaker.state import RouteState
from quantdrift.schemas.command import RouteCommand


def newest(commands: Iterable[RouteCommand]) -> dict[str, RouteCommand]:
    """Each route's command with the highest epoch (the topic may hold them out of order)."""
    out: dict[str, RouteCommand] = {}
    for command in commands:
        seen = out.get(command.route)
        if seen is None or command.epoch >= seen.epoch:
            out[command.route] = command
    return out


def rebuild(state: RouteState, command: RouteCommand, policy: RoutePolicy) -> RouteState | None:
    """``state`` as the breaker had it when it sent ``command``; None to leave it alone.

    >>> from quantdrift.schemas.command import RouteCommand
    >>> base = dict(command_id="c", route="r", epoch=7, issued_at=100.0)
    >>> policy, lost = RoutePolicy(), RouteState()
    >>> s = rebuild(lost, RouteCommand(action="rollback", target="reference",
    ...             evidence={"cooldown_s": 90.0}, **base), policy)
    >>> (s.state, s.epoch, s.target, s.opened_at, s.cooldown_s, s.locked)
    ('open', 7, 'reference', 100.0, 90.0, False)
    >>> rebuild(lost, RouteCommand(action="canary", percent=0, target="reference",
    ...         **base), policy).state
    'half_open'
    >>> s = rebuild(RouteState(pairs_seen=3), RouteCommand(action="rollback",
    ...             target="reference", source="manual", locked=True, **base), policy)
    >>> (s.state, s.locked, s.pairs_seen)
    ('open', True, 3)
    >>> rebuild(lost, RouteCommand(action="restore", target="candidate", **base), policy)
    >>> rebuild(RouteState(epoch=8), RouteCommand(action="rollback", target="reference",
    ...         **base), policy)
    """
    if state.epoch >= command.epoch:
        return None
    raw = command.evidence.get("cooldown_s")
    cooldown = float(raw) if isinstance(raw, int | float) else policy.cooldown_s
    base = state.evolve(
        epoch=command.epoch,
        target="reference",
        rules=RuleStates(),
        worst=(),
        updated_at=command.issued_at,
        last_decision="rebuilt",
    )
    if command.locked:
        if command.target != "reference":
            return base.evolve(state="closed", locked=True, target="candidate", opened_at=None)
        return base.evolve(state="open", locked=True, opened_at=command.issued_at)
    opened = base.evolve(
        locked=False, opened_at=command.issued_at, cooldown_s=cooldown, trips=state.trips + 1
    )
    if command.action == "rollback" and command.target == "reference":
        return opened.evolve(state="open")
    if command.action == "canary" and not command.percent:
        return opened.evolve(state="half_open")
    return None
