"""One ``BreakerStore`` protocol: the Redis store and its in-memory twin both keep it.

The live worker, the console, replay, eval and calibrate decide alike because they
run the same pure fold over the same protocol; ``tests/contract/test_breaker_store.py`` runs
every check on both stores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from quantdrift.breaker.outbox import Outbox, OutboxItem
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.state import RouteState
from quantdrift.breaker.step import Folded
from quantdrift.detectors.noise_floor import NoiseFloorState
from quantdrift.schemas.alert import AlertEvent
from quantdrift.schemas.score import ScoreEvent

MAX_ATTEMPTS = 20
# Each route's policy, by route: a batch may hold scores of many routes.
PolicyFor = Callable[[str], RoutePolicy]


@dataclass(frozen=True, slots=True)
class FoldResult:
    """``status``: ``ok`` or ``dup`` (the pair was folded before); ``outbox`` on a
    transition; ``alert`` on the score that revealed a new candidate."""

    status: str
    state: RouteState | None = None
    outbox: Outbox | None = None
    alert: AlertEvent | None = None


def result_of(
    folded: Folded | None, outbox: Outbox | None, alert: AlertEvent | None = None
) -> FoldResult:
    """A store's answer for one score of a :func:`~quantdrift.breaker.step.fold_many` step:
    a duplicate, a floor update, or the route's new state (with the outbox on the
    score that made the transition, the candidate-change alert on the score that
    revealed it)."""
    if folded is None:
        return FoldResult("dup")
    if folded.floor is not None:
        return FoldResult("ok")
    return FoldResult(
        "ok",
        folded.route_state,
        outbox if folded.transition is not None else None,
        alert if folded.change is not None else None,
    )


@dataclass(frozen=True, slots=True)
class Claim:
    """The right to publish and trim a route's outbox, until ``ack`` or expiry.

    ``token`` is unique per claim, so a worker whose claim expired cannot ack with it
    even after it claims again.
    """

    route: str
    token: str
    items: tuple[OutboxItem, ...]


class BreakerStore(Protocol):
    """Per-route breaker state; every method is safe to race across workers."""

    async def read(self, route: str) -> tuple[RouteState, int]: ...

    async def routes(self) -> list[str]: ...

    async def fold(self, score: ScoreEvent, policy: RoutePolicy, now: float) -> FoldResult: ...

    async def fold_batch(
        self, scores: Sequence[ScoreEvent], policy_for: PolicyFor, now: float
    ) -> list[FoldResult]:
        """Fold many scores, in order, with the same result as folding them one by one."""
        ...

    async def tick(self, route: str, policy: RoutePolicy, now: float) -> FoldResult: ...

    async def seed_floor(
        self, route: str, mode: str, values: list[dict[str, float]], merge: bool = False
    ) -> NoiseFloorState:
        """Write the route's noise floor for one decoding mode (``quantdrift calibrate``,
        and eval's floor): ``values`` replace it, or with ``merge`` are appended to it."""
        ...

    async def manual(
        self, route: str, action: str, policy: RoutePolicy, now: float, who: str = "cli"
    ) -> FoldResult: ...

    async def latest_command(self, route: str) -> bytes | None:
        """The route's latest signed command envelope, as gateways read it."""
        ...

    async def duplicates(self, route: str) -> int:
        """How many folds of this route were refused as already seen (redeliveries)."""
        ...

    async def claim(self, route: str, owner: str, ttl_ms: int = 10_000) -> Claim | None:
        """The outbox for ``owner`` alone; None when another holder has it, or it is empty."""
        ...

    async def ack(self, claim: Claim, count: int | None = None) -> bool:
        """Trim the claim's first ``count`` items (all by default) and end it.

        False, and nothing trimmed, when the claim is no longer held (fenced).
        """
        ...

    async def release(self, claim: Claim) -> None:
        """End a claim without trimming (the send failed): the next flush retries."""
        ...
