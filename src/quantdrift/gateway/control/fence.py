"""The gate every route command passes, as one pure function: applied, command, now ->
the new applied state or a refusal.

``RouteController`` (``controller.py``) is its follower: it reads commands from the
control topic and the Redis key, opens their envelopes (signature over the exact
bytes), calls :func:`fence` under its lock, and then keeps, counts, logs and tells its
listeners. Everything that decides whether a verified command applies is here:

* the same command again (a topic redelivery, the Redis mirror): ``duplicate``;
* epoch not newer than the applied one, ``issued_at`` from the future, or too old
  while it would put users on the candidate: the verifier's reasons
  (``CommandVerifier.staleness``);
* a target role this gateway has no pool for (``targets.py``): ``unmappable_target``;
* a slice selector on a tag dimension this gateway does not compute (or a gateway that
  maps no slices at all, as a follower that splits by weight): ``unmappable_slice``.

A command with a slice selector moves that slice only: the route as a whole stays on
its candidate (a slice is only ever held while its route is closed), and the command's
``slices`` list says where every held slice goes (``schemas/command.py``), so applying
it replaces the route's slices whole.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from quantdrift.errors import UnmappableCommand
from quantdrift.gateway.control.targets import Resolver
from quantdrift.schemas.command import Action, RouteCommand, SliceSelector, Target
from quantdrift.schemas.signing import CommandVerifier


@dataclass(frozen=True, slots=True)
class AppliedSlice:
    """Where one slice of a route goes here: its action and the pool its target maps to."""

    dimension: str
    value: str
    action: Action
    target_precision: str
    percent: float | None = None

    @property
    def key(self) -> str:
        return f"{self.dimension}={self.value}"


@dataclass(frozen=True, slots=True)
class AppliedCommand:
    """What the gateway does for a route now, and since when (monotonic seconds).

    ``target_precision`` is the pool the route as a whole goes to here (the role itself
    when the controller has no resolver); ``slices`` the slices held apart from it.
    Everything else is the verified command's own, read from it rather than copied, so
    the two cannot disagree; for a slice's command the route-wide ``action`` is
    ``restore`` (the route stays on its candidate) and its ``percent`` None.
    """

    target_precision: str
    command: RouteCommand
    applied_at: float
    source: str  # "kafka" or "redis"
    slices: tuple[AppliedSlice, ...] = ()

    @property
    def epoch(self) -> int:
        return self.command.epoch

    @property
    def action(self) -> Action:
        return "restore" if self.command.slice is not None else self.command.action

    @property
    def locked(self) -> bool:
        return self.command.locked

    @property
    def percent(self) -> float | None:
        return None if self.command.slice is not None else self.command.percent

    @property
    def breaker_state(self) -> str:
        return self.command.state

    def slice_of(self, tags: Mapping[str, str]) -> AppliedSlice | None:
        """The held slice a request with ``tags`` belongs to (the first, by key)."""
        for held in self.slices:
            if tags.get(held.dimension) == held.value:
                return held
        return None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a verified command does not apply: a counter's name and a log line."""

    reason: str
    message: str


def fence(
    applied: AppliedCommand | None,
    command: RouteCommand,
    *,
    now: float,
    wall_now: float,
    verifier: CommandVerifier,
    resolve: Resolver,
    dimensions: Collection[str],
    source: str,
) -> AppliedCommand | Refusal:
    """The route's new applied state, or why ``command`` does not apply (pure).

    ``now`` is monotonic (when it applied), ``wall_now`` the wall clock its
    ``issued_at`` is checked against; ``dimensions`` the slice tags this gateway
    computes for every request.
    """
    if applied is not None and command.command_id == applied.command.command_id:
        return Refusal("duplicate", f"command {command.command_id} seen again")
    stale = verifier.staleness(command, applied.epoch if applied else 0, wall_now)
    if stale is not None:
        return Refusal(*stale)
    for selector in (*((command.slice,) if command.slice else ()), *command.slices):
        if selector.dimension not in dimensions:
            return Refusal("unmappable_slice", _unmappable(command, selector, dimensions))
    try:
        if command.slice is None:
            pool = resolve(command)
        else:
            _role(resolve, command, command.target, command.target_precision)  # its hint
            pool = _role(resolve, command, "candidate")
        slices = tuple(
            AppliedSlice(
                h.dimension, h.value, h.action, _role(resolve, command, h.target), h.percent
            )
            for h in command.slices
        )
    except UnmappableCommand as exc:
        return Refusal("unmappable_target", str(exc))
    return AppliedCommand(pool, command, now, source, slices)


def _role(resolve: Resolver, command: RouteCommand, role: Target, hint: str | None = None) -> str:
    """The pool ``role`` maps to for ``command``'s route (``targets.py``), checked
    against ``hint`` when the policy named one."""
    return resolve(command.model_copy(update={"target": role, "target_precision": hint}))


def _unmappable(command: RouteCommand, selector: SliceSelector, dimensions: Collection[str]) -> str:
    known = ", ".join(sorted(dimensions)) or "none: this gateway holds no slice apart"
    return (
        f"command {command.command_id}: slice {selector.key} is on a tag this gateway "
        f"does not compute (it maps {known}); the route keeps what it serves"
    )
