"""A route's whole decision state: one JSON value, read and written whole."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class WorstPair:
    pair_id: str
    similarity: float | None
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RouteState:
    """Everything the judge needs between two scores of a route.

    ``epoch`` is bumped by every transition (``machine.next_epoch``) and fences
    commands at the gateway; ``target`` is a role, ``candidate`` or ``reference``;
    ``window`` holds (similarity, anomaly, teacher-forced KL) of the last shadow pairs.
    """

    state: BreakerState = "closed"
    epoch: int = 0
    target: str = ""
    locked: bool = False
    pairs_seen: int = 0
    consecutive_failures: int = 0
    window: tuple[tuple[float | None, bool, float | None], ...] = ()
    seq_n: int = 0
    seq_log_m: float = 0.0
    opened_at: float | None = None
    cooldown_s: float = 0.0
    half_open_passes: int = 0
    trips: int = 0
    worst: tuple[WorstPair, ...] = ()
    last_decision: str = ""
    last_similarity: float | None = None
    updated_at: float = 0.0
    # The tolerance rule (breaker/rules.py): per signal, its e-detector's state
    # (pairs, sum of x, log R per bet size); ``early`` names a signal whose test
    # crossed before ``min_pairs``: that evidence is kept and trips at min_pairs.
    tests: dict[str, tuple[float, ...]] = field(default_factory=dict)
    early: str = ""
    # The candidate's engine/version/weights the evidence above is about
    # (``ScoreEvent.candidate_engine``; "" = not known yet): breaker/candidate.py.
    candidate_engine: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RouteState:
        if not data:
            return cls()
        data = dict(data)
        data["window"] = tuple(
            (w[0], bool(w[1]), w[2] if len(w) > 2 else None) for w in data.get("window", ())
        )
        data["worst"] = tuple(
            WorstPair(w["pair_id"], w["similarity"], tuple(w["reasons"]))
            for w in data.get("worst", ())
        )
        data["tests"] = {
            str(k): tuple(float(x) for x in v) for k, v in (data.get("tests") or {}).items()
        }
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
