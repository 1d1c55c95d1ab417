"""Which precision serves a request, which runs in shadow, and where to fall back.

One pure function, ``decide``: no I/O, no clock, so every rule of the routing
is in this file and tested as a table.

Rules, first match wins:

1. ``high_precision`` preference: the user gets the reference; the candidate runs
   in shadow (unless the route is rolled back: then it does not run at all).
2. The route is rolled back (the controller's target is the reference precision,
   action ``rollback`` or ``restore`` to the reference): users get the reference,
   the candidate does not run (it is suspended until the breaker half-opens).
3. Half-open (action ``canary`` with percent 0): users get the reference and the
   candidate runs in shadow. Roles swap: the *shadow* call is the candidate.
4. Canary with percent p > 0: a deterministic p % of requests (by request id)
   get the candidate, the rest the reference; the other side is the shadow.
5. The request's slice is held apart (a slice-scoped rollback: the directive's
   ``slices``, matched on the request's tags): rolled back, the reference serves it
   and the candidate does not run (mode ``slice_rolled_back``); half-open, the
   reference serves it and the candidate runs in shadow (``slice_half_open``). The
   rest of the route goes on by rules 4 and 6.
6. Otherwise (no command, or a command whose target is not the reference):
   users get the target (the route's candidate by default); the reference is the
   shadow side.

A route held by its launch gate (``candidate_cap``: its preflight report does
not verify yet, see ``gateway/control/preflight_gate.py``) sends at most that percent
of requests to the candidate: rule 5 becomes a canary at the cap (mode
``awaiting_preflight``), and a canary's percent is lowered to it. Rules 1-3
never serve the candidate, so the gate does not touch them.

The fallback chain is the configured precision order from the serving
precision onward (INT4 -> INT8 -> BF16): a JSON or degeneration failure, or
an upstream failure, moves to the next one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from quantdrift.gateway.chain.sampling import sampled

Preference = Literal["cost_optimized", "high_precision"]
PREFERENCES: tuple[str, ...] = ("cost_optimized", "high_precision")
Mode = Literal[
    "normal",
    "high_precision",
    "rolled_back",
    "half_open",
    "canary",
    "awaiting_preflight",
    "slice_rolled_back",
    "slice_half_open",
]

CANARY_SALT = "canary:"


@dataclass(frozen=True, slots=True)
class SliceDirective:
    """One slice of a route held apart from it: requests whose tag ``dimension`` is
    ``value`` go by ``action`` (``rollback`` to the reference, or ``canary`` at 0 %:
    half-open) to ``target_precision``."""

    dimension: str
    value: str
    action: str
    target_precision: str
    percent: float | None = None


@dataclass(frozen=True, slots=True)
class RouteDirective:
    """What routing reads of a route's command: action, target pool, percent.

    None fields: no command yet. A route's decision takes one name per shape on
    its way here, each owned by one side:

    1. ``breaker.state.RouteState``: the breaker's whole per-route state
       (closed / open / half_open, epoch, evidence), in Redis; the worker's.
    2. ``schemas.command.RouteCommand``: what a transition sends on the wire,
       signed, its target a role (``candidate`` / ``reference``).
    3. ``gateway.control.controller.AppliedCommand``: the command a gateway
       accepted, its role mapped onto a pool (``control/targets.py``), with the
       epoch, lock and source it was applied with.
    4. ``RouteDirective`` (this): the three fields of it that ``decide`` needs,
       built by the Gateway from the AppliedCommand (or a fail-closed rollback
       until the controller knows every route), so routing stays pure and knows
       nothing of epochs, signatures or Redis.
    """

    action: str | None = None
    target_precision: str | None = None
    percent: float | None = None
    slices: tuple[SliceDirective, ...] = field(default=())

    def slice_of(self, tags: Mapping[str, str]) -> SliceDirective | None:
        """The held slice a request with ``tags`` belongs to (the first)."""
        for held in self.slices:
            if tags.get(held.dimension) == held.value:
                return held
        return None


@dataclass(frozen=True, slots=True)
class Decision:
    """The plan for one request.

    ``serve`` is the precision the user is answered from; ``chain`` is where to
    go on failure, ``serve`` first. ``pair_candidate`` / ``pair_reference`` are
    the two sides of a shadow pair, or ``pair_candidate`` None when no shadow may
    run (rolled back).
    """

    serve: str
    chain: tuple[str, ...]
    mode: Mode
    pair_candidate: str | None
    pair_reference: str

    @property
    def shadow_precision(self) -> str | None:
        """The precision the shadow call goes to (the side the user is not on)."""
        if self.pair_candidate is None:
            return None
        return self.pair_reference if self.serve != self.pair_reference else self.pair_candidate


def fallback_chain(order: Sequence[str], start: str) -> tuple[str, ...]:
    """``order`` from ``start`` onward; just ``(start,)`` if it is not in the order.

    >>> fallback_chain(["int4", "int8", "bf16"], "int8")
    ('int8', 'bf16')
    """
    if start not in order:
        return (start,)
    return tuple(order[list(order).index(start) :])


def decide(
    *,
    order: Sequence[str],
    candidate: str,
    reference: str,
    preference: Preference,
    directive: RouteDirective | None,
    request_id: str,
    candidate_cap: float | None = None,
    tags: Mapping[str, str] | None = None,
) -> Decision:
    """The routing decision for one request (pure; see the module docstring); ``tags``
    are the request's slice tags (``slices.request_tags``).

    >>> d = decide(order=["int4", "int8", "bf16"], candidate="int4", reference="bf16",
    ...            preference="cost_optimized", directive=None, request_id="r1")
    >>> d.serve, d.chain, d.shadow_precision
    ('int4', ('int4', 'int8', 'bf16'), 'bf16')
    """
    state = directive or RouteDirective()
    target = state.target_precision
    rolled_back = target == reference and state.action in ("rollback", "restore")
    half_open = state.action == "canary" and not state.percent
    held = state.slice_of(tags or {})
    slice_back = held is not None and held.action in ("rollback", "restore")
    slice_back = slice_back and held is not None and held.target_precision == reference

    def plan(serve: str, mode: Mode, shadow: bool = True) -> Decision:
        # The pair's candidate is what runs quantized: the serving precision, or the
        # route's candidate when the user is on the reference.
        pair_candidate = serve if serve != reference else candidate
        return Decision(
            serve=serve,
            chain=fallback_chain(order, serve),
            mode=mode,
            pair_candidate=pair_candidate if shadow and pair_candidate != reference else None,
            pair_reference=reference,
        )

    if preference == "high_precision":
        return plan(reference, "high_precision", shadow=not (rolled_back or slice_back))
    if rolled_back:
        return plan(reference, "rolled_back", shadow=False)
    if half_open:
        return plan(reference, "half_open")
    if slice_back:
        return plan(reference, "slice_rolled_back", shadow=False)
    if held is not None and held.action == "canary" and not held.percent:
        return plan(reference, "slice_half_open")
    if state.action == "canary":
        percent = float(state.percent or 0.0)
        if candidate_cap is not None:
            percent = min(percent, candidate_cap)
        on_candidate = sampled(request_id, min(1.0, percent / 100.0), CANARY_SALT)
        quantized = target if target and target != reference else candidate
        return plan(quantized if on_candidate else reference, "canary")
    serve = target or candidate
    if candidate_cap is not None and serve != reference:
        on_candidate = sampled(request_id, min(1.0, candidate_cap / 100.0), CANARY_SALT)
        return plan(serve if on_candidate else reference, "awaiting_preflight")
    return plan(serve, "normal")


def route_shares(
    *, candidate: str, reference: str, directive: RouteDirective | None
) -> dict[str, float]:
    """The percent of a route's users each pool serves: ``decide``'s rules for the whole
    route rather than one request (the default preference, no launch cap), for a gateway
    that splits by weight instead of by request id (``follower.py``).

    >>> route_shares(candidate="int4", reference="bf16", directive=None)
    {'int4': 100.0}
    >>> route_shares(candidate="int4", reference="bf16",
    ...              directive=RouteDirective("rollback", "bf16"))
    {'bf16': 100.0}
    >>> route_shares(candidate="int4", reference="bf16",
    ...              directive=RouteDirective("canary", "int4", 10.0))
    {'int4': 10.0, 'bf16': 90.0}
    """
    state = directive or RouteDirective()
    target = state.target_precision
    if (target == reference and state.action in ("rollback", "restore")) or (
        state.action == "canary" and not state.percent
    ):
        return {reference: 100.0}  # rolled back, or half-open: the candidate only in shadow
    if state.action == "canary":
        percent = min(100.0, max(0.0, float(state.percent or 0.0)))
        quantized = target if target and target != reference else candidate
        shares = {quantized: percent, reference: 100.0 - percent}
        return {pool: share for pool, share in shares.items() if share > 0}
    return {target or candidate: 100.0}
