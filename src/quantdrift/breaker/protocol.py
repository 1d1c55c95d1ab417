"""One ``BreakerStore`` protocol: the Redis store and its in-memory twin both keep it.

The live worker, the console, replay, eval and calibrate decide alike because they
run the same pure fold over the same protocol; ``tests/contract/test_breaker_store.py`` runs
every check on both stores.

Both stores inherit ``fold`` and ``fold_batch`` from the protocol and supply only
``fold_prefix`` (read, :func:`~quantdrift.breaker.step.fold_many`, commit), so they
cannot drift apart in how a batch is cut: ``fold_batch`` groups the batch by route,
folds prefix after prefix onto the state the last one committed, and retries a
lost race up to ``MAX_ATTEMPTS`` times.

A prefix that was a tick alone (the cool-down was over when the batch came)
consumes no score; its outbox is reported as ``ticked`` on the route's next
score in the batch (there always is one: a tick-only prefix consumed nothing),
so the caller counts, logs and traces it like any other transition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from quantdrift.breaker.outbox import (
    Outbox,
    OutboxItem,
    alert_item,
    build_outbox,
    change_alert,
    not_armed_alert,
)
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.state import RouteState
from quantdrift.breaker.step import Folded, FoldedMany, last_pair_id
from quantdrift.detectors.noise_floor import NoiseFloorState
from quantdrift.errors import BreakerStoreError
from quantdrift.schemas.alert import AlertEvent
from quantdrift.schemas.score import ScoreEvent
from quantdrift.schemas.signing import CommandSigner

MAX_ATTEMPTS = 20
# Each route's policy, by route: a batch may hold scores of many routes.
PolicyFor = Callable[[str], RoutePolicy]


@dataclass(frozen=True, slots=True)
class FoldResult:
    """``status``: ``ok`` or ``dup`` (the pair was folded before); ``outbox`` on a
    transition; ``alert`` on the score that revealed a new candidate; ``ticked`` on
    the first score folded after a cool-down tick committed on its own (``fold_many``
    ticks first), so the caller counts and logs that transition too; ``notices``
    the tests this score found abstaining for want of a floor for the first time (the
    worker logs them), ``not_armed`` the one "not armed" alert of the candidate."""

    status: str
    state: RouteState | None = None
    outbox: Outbox | None = None
    alert: AlertEvent | None = None
    ticked: Outbox | None = None
    notices: tuple[str, ...] = ()
    not_armed: AlertEvent | None = None

    @property
    def outboxes(self) -> list[Outbox]:
        """Every transition this answer carries, in the order they were committed."""
        return [o for o in (self.ticked, self.outbox) if o is not None]


def result_of(
    folded: Folded | None,
    outbox: Outbox | None,
    alert: AlertEvent | None = None,
    not_armed: AlertEvent | None = None,
) -> FoldResult:
    """A store's answer for one score of a :func:`~quantdrift.breaker.step.fold_many` step:
    a duplicate, a floor update, or the route's new state (with the outbox on the
    score that made the transition, the candidate-change alert on the score that
    revealed it, the "not armed" alert on the score that raised it)."""
    if folded is None:
        return FoldResult("dup")
    if folded.floor is not None:
        return FoldResult("ok")
    return FoldResult(
        "ok",
        folded.route_state,
        outbox if folded.transition is not None else None,
        alert if folded.change is not None else None,
        notices=folded.notices,
        not_armed=not_armed if folded.not_armed else None,
    )


@dataclass(frozen=True, slots=True)
class StepMessages:
    """What one committed prefix sends: the transition's outbox (its signed command
    and alert), the candidate-change alert, the "not armed" alert. Both stores build
    it with :func:`step_messages` and queue :meth:`items` in the one commit."""

    outbox: Outbox | None = None
    alert: AlertEvent | None = None
    not_armed: AlertEvent | None = None

    def items(self) -> tuple[bytes, ...]:
        """The outbox items in queue order. The change's alert goes first: it explains
        the state the transition left."""
        alerts = tuple(alert_item(a) for a in (self.alert, self.not_armed) if a is not None)
        return alerts + (self.outbox.items() if self.outbox else ())

    def results(self, step: FoldedMany) -> list[FoldResult]:
        """A store's answer per score the prefix consumed (:func:`result_of`)."""
        return [result_of(o, self.outbox, self.alert, self.not_armed) for o in step.outcomes]


def step_messages(
    route: str, step: FoldedMany, scores: Sequence[ScoreEvent], signer: CommandSigner, now: float
) -> StepMessages:
    """The messages of a fold step (none when it folded no shadow pair)."""
    state = step.state
    if state is None:
        return StepMessages()
    outbox = alert = unarmed = None
    if step.transition is not None:
        outbox = build_outbox(route, step.transition, state, signer, now, "breaker")
    if step.change is not None:
        alert = change_alert(route, step.change, state, now)
    if step.not_armed:
        unarmed = not_armed_alert(route, step.not_armed, state, last_pair_id(scores, step), now)
    return StepMessages(outbox, alert, unarmed)


@dataclass(frozen=True, slots=True)
class Prefix:
    """One commit of a route's batch: a result per score it consumed, in order, and the
    outbox of a tick-only commit."""

    results: list[FoldResult]
    ticked: Outbox | None = None


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

    async def fold(self, score: ScoreEvent, policy: RoutePolicy, now: float) -> FoldResult:
        """Fold one score exactly once (by pair_id): a batch of one, so one code path
        decides dedupe, compare-and-set and the outbox in every store."""
        return (await self.fold_batch([score], lambda _route: policy, now))[0]

    async def fold_batch(
        self, scores: Sequence[ScoreEvent], policy_for: PolicyFor, now: float
    ) -> list[FoldResult]:
        """Fold many scores, in order, with the same result as folding them one by one."""
        results = [FoldResult("dup")] * len(scores)
        by_route: dict[str, list[int]] = {}
        for i, score in enumerate(scores):
            by_route.setdefault(score.route, []).append(i)
        for route, pending in by_route.items():
            policy = policy_for(route)
            conflicts, ticked = 0, None
            while pending:
                prefix = await self.fold_prefix(route, [scores[i] for i in pending], policy, now)
                if prefix is None:
                    conflicts += 1
                    if conflicts >= MAX_ATTEMPTS:
                        raise BreakerStoreError(
                            f"route {route}: gave up after {MAX_ATTEMPTS} write conflicts"
                        )
                    continue
                for i, result in zip(pending, prefix.results, strict=False):
                    if ticked is not None:
                        result, ticked = replace(result, ticked=ticked), None
                    results[i] = result
                ticked = prefix.ticked or ticked
                pending = pending[len(prefix.results) :]
        return results

    async def fold_prefix(
        self, route: str, scores: Sequence[ScoreEvent], policy: RoutePolicy, now: float
    ) -> Prefix | None:
        """Fold one route's scores up to the first transition and commit that, atomically;
        None when another writer committed first (the caller re-reads and refolds)."""
        ...

    async def tick(self, route: str, policy: RoutePolicy, now: float) -> FoldResult: ...

    async def read_floors(self, route: str) -> dict[str, NoiseFloorState]:
        """The route's floors by decoding mode (modes without one are left out): what
        route status, the verdict API and the status page judge readiness with."""
        ...

    async def seed_floor(
        self, route: str, mode: str, values: list[dict[str, float]], merge: bool = False
    ) -> NoiseFloorState:
        """Write the route's noise floor for one decoding mode (``quantdrift calibrate``,
        and eval's floor): ``values`` replace it, or with ``merge`` are appended to it."""
        ...

    async def manual(
        self, route: str, action: str, policy: RoutePolicy, now: float, who: str = "cli"
    ) -> FoldResult: ...

    async def remembers(self) -> bool:
        """Whether the store still holds what it was given (False after a data loss)."""
        ...

    async def remember(self) -> None: ...

    async def seed(self, route: str, rebuild: Callable[[RouteState], RouteState | None]) -> bool:
        """Replace the route's state by ``rebuild(state)`` unless None; whether it was."""
        ...

    async def latest_command(self, route: str) -> bytes | None:
        """The route's latest signed command envelope, as gateways read it."""
        ...

    async def duplicates(self, route: str) -> int:
        """How many folds of this route were refused as already seen (redeliveries)."""
        ...

    async def spend_reports(self, route: str) -> list[dict[str, Any]]:
        """The live gateways' reports of their shadow spend and share on the route
        (``schemas.keys.spend_key``), what the status page sums; a store no gateway
        reports to has none."""
        return []

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
