"""A route's whole decision state: one JSON value, read and written whole."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules import RuleStates

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class WorstPair:
    """One of the pairs a route keeps for its alerts (``breaker/worst.py``)."""

    pair_id: str
    similarity: float | None
    reasons: tuple[str, ...]
    tags: dict[str, str] = field(default_factory=dict)
    prompt_hash: str | None = None
    prompt_excerpt: str | None = None
    divergence: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, w: dict[str, Any]) -> WorstPair:
        """Reads what ``asdict`` writes, and the three-field entries written before."""
        return cls(
            w["pair_id"],
            w["similarity"],
            tuple(w["reasons"]),
            tags={str(k): str(v) for k, v in (w.get("tags") or {}).items()},
            prompt_hash=w.get("prompt_hash"),
            prompt_excerpt=w.get("prompt_excerpt"),
            divergence=w.get("divergence"),
        )


@dataclass(frozen=True, slots=True)
class ReadinessState:
    """What a route's shadow pairs have shown about which of its tests can fire.

    Kept by the fold (``breaker/readiness.py``: :func:`~quantdrift.breaker.readiness.observe`)
    because readiness needs facts no floor holds: which evidence the route's pairs
    carry (``carried``: per divergence signal, the shadow pairs that carried it, e.g.
    teacher-forced log-probs for ``tf_kl``) and in which decoding modes they come
    (``modes``; each mode has its own floor). ``missing`` is what the last shadow pair
    found missing ("rule: reason", relied-on rules only) and ``armed`` whether every
    relied-on test could fire on it (``min_pairs`` included); ``noted`` the rules whose
    abstention for want of a floor was reported once; ``alerted`` whether the one P2
    "not armed" alert was raised for this candidate. ``progress`` (the nearest
    tolerance test's log e over its threshold, 0 to 1) and ``short_slices`` (judged
    slice values below ``slice_min_pairs``, of ``slices`` judged) say how sure the
    evidence is: gateways read them to set an adaptive shadow share
    (``breaker/readiness.py:sureness``).
    """

    carried: dict[str, int] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    armed: bool = False
    noted: tuple[str, ...] = ()
    alerted: bool = False
    progress: float = 0.0
    short_slices: int = 0
    slices: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ReadinessState:
        data = data or {}
        return cls(
            carried={str(k): int(v) for k, v in (data.get("carried") or {}).items()},
            modes={str(k): int(v) for k, v in (data.get("modes") or {}).items()},
            missing=tuple(str(v) for v in data.get("missing") or ()),
            armed=bool(data.get("armed", False)),
            noted=tuple(str(v) for v in data.get("noted") or ()),
            alerted=bool(data.get("alerted", False)),
            progress=float(data.get("progress", 0.0)),
            short_slices=int(data.get("short_slices", 0)),
            slices=int(data.get("slices", 0)),
        )


SliceBreakerState = Literal["open", "half_open"]


@dataclass(frozen=True, slots=True)
class HeldSlice:
    """One slice held apart from its route by a slice-scoped rollback
    (``breaker/slice_scope.py``): ``open`` (its requests served by the reference) or
    ``half_open`` (the reference serves, the candidate runs in shadow for it). A slice
    that restores leaves ``RouteState.held``; one that keeps failing (``trips``) widens
    to the route. ``passes`` counts its half-open probe's passing pairs."""

    dimension: str
    value: str
    state: SliceBreakerState = "open"
    opened_at: float = 0.0
    cooldown_s: float = 0.0
    trips: int = 1
    passes: int = 0

    @property
    def key(self) -> str:
        return f"{self.dimension}={self.value}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeldSlice:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True, slots=True)
class RouteState:
    """Everything the judge needs between two scores of a route: the breaker's
    lifecycle, a few readouts, the rules' evidence (``rules``, one state per rule:
    :mod:`quantdrift.breaker.rules`) and what the pairs showed about which rules can
    fire (``readiness``), and the slices held apart by a slice-scoped rollback
    (``held``, by ``dimension=value``; only while the route itself is closed).

    ``epoch`` is bumped by every transition (``machine.next_epoch``) and fences
    commands at the gateway; ``target`` is a role, ``candidate`` or ``reference``;
    ``candidate_engine`` is the candidate's engine/version/weights the evidence is
    about (``ScoreEvent.candidate_engine``; "" = not known yet): breaker/candidate.py.
    ``first_pair_at`` / ``last_pair_at`` bound the pairs ``pairs_seen`` counts.
    """

    state: BreakerState = "closed"
    epoch: int = 0
    target: str = ""
    locked: bool = False
    opened_at: float | None = None
    cooldown_s: float = 0.0
    trips: int = 0
    candidate_engine: str = ""
    pairs_seen: int = 0
    # The time window of the shadow pairs counted in ``pairs_seen`` (their own ``ts``):
    # what a certificate's live evidence says it covers.
    first_pair_at: float | None = None
    last_pair_at: float | None = None
    worst: tuple[WorstPair, ...] = ()
    last_decision: str = ""
    last_similarity: float | None = None
    updated_at: float = 0.0
    rules: RuleStates = field(default_factory=RuleStates)
    readiness: ReadinessState = field(default_factory=ReadinessState)
    held: dict[str, HeldSlice] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RouteState:
        """Reads what ``to_json`` writes, and the flat layout written before the rules
        owned their states (every rule's fields beside the lifecycle's)."""
        if not data:
            return cls()
        data = dict(data)
        rules = data.get("rules")
        data["rules"] = (
            RuleStates.from_json(rules) if isinstance(rules, dict) else RuleStates.from_flat(data)
        )
        readiness = data.get("readiness")
        data["readiness"] = ReadinessState.from_json(
            readiness if isinstance(readiness, dict) else None
        )
        data["held"] = {str(k): HeldSlice.from_json(v) for k, v in (data.get("held") or {}).items()}
        data["worst"] = tuple(WorstPair.from_json(w) for w in data.get("worst", ()))
        if data.get("target") not in (None, "", "candidate", "reference"):
            # Written before targets were roles: the state says which side it is.
            data["target"] = "candidate" if data.get("state") == "closed" else "reference"
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def evolve(self, **changes: Any) -> RouteState:
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Transition:
    """One breaker transition: what the outbox turns into a command and an alert."""

    from_state: BreakerState
    to_state: BreakerState
    action: Literal["rollback", "restore", "canary"]
    target: Literal["candidate", "reference"]
    rule: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    # The concrete precision the policy names for the target role, if any.
    target_precision: str | None = None
    # A slice-scoped transition's slice (dimension, value); None moves the whole route.
    slice: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What folding one score (or a tick, or an operator's command) did to a route."""

    state: RouteState
    transition: Transition | None = None


def next_epoch(last: int, now: float) -> int:
    """A hybrid logical clock: one more than the last epoch, and never below ``now`` in ms.

    Gateways apply only commands newer than the last they applied. A counter kept in
    Redis restarts at 1 when Redis loses the route's state, and every gateway would
    then refuse the next rollback as stale; the wall clock in milliseconds keeps the
    epoch growing across that loss (as long as workers' clocks agree to within the
    time between two transitions of a route).

    >>> next_epoch(0, 1.5), next_epoch(1500, 1.5), next_epoch(7, 0.0)
    (1500, 1501, 8)
    """
    return max(last + 1, int(now * 1000))


def target_hint(policy: RoutePolicy, target: str) -> str | None:
    """The concrete precision the policy names for a role, if it names one."""
    return policy.reference_precision if target == "reference" else policy.candidate_precision
