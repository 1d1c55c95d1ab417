"""A route's whole decision state: one JSON value, read and written whole."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from quantdrift.breaker.rules import RuleStates

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class WorstPair:
    pair_id: str
    similarity: float | None
    reasons: tuple[str, ...]


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
    "not armed" alert was raised for this candidate.
    """

    carried: dict[str, int] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    armed: bool = False
    noted: tuple[str, ...] = ()
    alerted: bool = False

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
        )


@dataclass(frozen=True, slots=True)
class RouteState:
    """Everything the judge needs between two scores of a route: the breaker's
    lifecycle, a few readouts, the rules' evidence (``rules``, one state per rule:
    :mod:`quantdrift.breaker.rules`) and what the pairs showed about which rules can
    fire (``readiness``).

    ``epoch`` is bumped by every transition (``machine.next_epoch``) and fences
    commands at the gateway; ``target`` is a role, ``candidate`` or ``reference``;
    ``candidate_engine`` is the candidate's engine/version/weights the evidence is
    about (``ScoreEvent.candidate_engine``; "" = not known yet): breaker/candidate.py.
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
    worst: tuple[WorstPair, ...] = ()
    last_decision: str = ""
    last_similarity: float | None = None
    updated_at: float = 0.0
    rules: RuleStates = field(default_factory=RuleStates)
    readiness: ReadinessState = field(default_factory=ReadinessState)

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
        data["worst"] = tuple(
            WorstPair(w["pair_id"], w["similarity"], tuple(w["reasons"]))
            for w in data.get("worst", ())
        )
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
