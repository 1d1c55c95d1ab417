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

Pure: the worker's judge stage reads the topic and writes the state
(``streams/judge_stage.py``), only where Redis holds none.
"""

from __future__ import annotations

from collections.abc import Iterable

from quantdrift.breaker.policy import RoutePolicy
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


def state_from_command(command: RouteCommand, policy: RoutePolicy) -> RouteState | None:
    """The state the breaker had when it sent ``command``; None when closed is right.

    >>> from quantdrift.schemas.command import RouteCommand
    >>> base = dict(command_id="c", route="r", epoch=7, issued_at=100.0)
    >>> policy = RoutePolicy()
    >>> s = state_from_command(RouteCommand(action="rollback", target="reference",
    ...                        evidence={"cooldown_s": 90.0}, **base), policy)
    >>> (s.state, s.epoch, s.target, s.opened_at, s.cooldown_s, s.locked)
    ('open', 7, 'reference', 100.0, 90.0, False)
    >>> s = state_from_command(RouteCommand(action="canary", percent=0, target="reference",
    ...                        **base), policy)
    >>> (s.state, s.cooldown_s)
    ('half_open', 60.0)
    >>> s = state_from_command(RouteCommand(action="rollback", target="reference",
    ...                        source="manual", locked=True, **base), policy)
    >>> (s.state, s.locked)
    ('open', True)
    >>> state_from_command(RouteCommand(action="restore", target="candidate", **base), policy)
    """
    raw = command.evidence.get("cooldown_s")
    cooldown = float(raw) if isinstance(raw, int | float) else policy.cooldown_s
    base = RouteState(epoch=command.epoch, target="reference", updated_at=command.issued_at)
    if command.locked:
        if command.target != "reference":
            return base.evolve(state="closed", locked=True, target="candidate")
        return base.evolve(state="open", locked=True, opened_at=command.issued_at)
    opened = base.evolve(opened_at=command.issued_at, cooldown_s=cooldown, trips=1)
    if command.action == "rollback" and command.target == "reference":
        return opened.evolve(state="open")
    if command.action == "canary" and not command.percent:
        return opened.evolve(state="half_open")
    return None
