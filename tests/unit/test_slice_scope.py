"""Slice-scoped rollback in the pure fold, through the store every worker folds with.

A drift confined to Chinese rolls back ``language=zh`` alone: the signed command names
the slice and every slice held, the rest of the route stays closed on the candidate,
the slice half-opens and restores on its own, each transition bumps the route's one
epoch and yields one command and one alert; a slice that keeps failing, or a second
slice, widens to the route.
"""

from __future__ import annotations

import json

from quantdrift.breaker import RouteState
from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.protocol import FoldResult
from quantdrift.schemas import Metrics, ScoreEvent
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.signing import CommandSigner, CommandVerifier

KEY = b"k" * 32
LOOP = Metrics(repetition_run=8, candidate_tokens=40)
GOOD = Metrics(candidate_tokens=40)
POLICY = RoutePolicy(
    rollback_scope="slice",
    slice_dimensions=("language",),
    slice_min_pairs=5,
    min_pairs=5,
    cooldown_s=10.0,
    half_open_pairs=3,
)


class Walk:
    """One route's scores through a memory store; every command as a gateway opens it."""

    def __init__(self, policy: RoutePolicy = POLICY) -> None:
        self.store = MemoryBreakerStore(CommandSigner("k1", KEY))
        self.verifier = CommandVerifier({"k1": KEY})
        self.policy = policy
        self.n = 0
        self.commands: list[RouteCommand] = []
        self.alerts: list[str] = []

    async def pair(self, language: str, m: Metrics, now: float) -> RouteCommand | None:
        self.n += 1
        score = ScoreEvent(
            pair_id=f"p{self.n}", route="r", kind="shadow", ts=now, decoding="greedy",
            metrics=m, tags={"language": language},
        )  # fmt: skip
        return self._took(await self.store.fold(score, self.policy, now))

    async def tick(self, now: float) -> RouteCommand | None:
        return self._took(await self.store.tick("r", self.policy, now))

    def _took(self, result: FoldResult) -> RouteCommand | None:
        command = None
        for outbox in result.outboxes:
            command = self.verifier.open(outbox.sealed)
            assert not self.commands or command.epoch > self.commands[-1].epoch  # monotonic
            self.commands.append(command)
            self.alerts.append(outbox.alert.summary)
        return command

    async def state(self) -> RouteState:
        return (await self.store.read("r"))[0]


async def test_a_chinese_drift_rolls_back_chinese_alone_then_half_opens_and_restores() -> None:
    walk = Walk()
    now = 0.0
    command = None
    for i in range(200):  # English healthy, Chinese looping, one in four
        now += 0.01
        command = await walk.pair("zh" if i % 4 == 3 else "en", LOOP if i % 4 == 3 else GOOD, now)
        if command is not None:
            break
    assert command is not None and command.action == "rollback"
    assert command.slice is not None and command.slice.key == "language=zh"
    assert [(h.key, h.action) for h in command.slices] == [("language=zh", "rollback")]
    assert command.target == "reference" and command.evidence["rule"] == "tolerance:hard@language=zh"
    assert walk.alerts[-1].startswith("r [slice language=zh]: closed -> open (rollback to the ")
    state = await walk.state()
    assert state.state == "closed" and state.target == "candidate"
    assert state.held["language=zh"].state == "open"

    # English keeps being judged (no command), a Chinese pair in flight is ignored.
    assert await walk.pair("en", GOOD, now + 0.1) is None
    assert await walk.pair("zh", LOOP, now + 0.2) is None
    assert (await walk.state()).last_decision == "ignored@language=zh"
    assert await walk.tick(now + 5) is None  # cool-down not over

    probe = await walk.tick(now + 10.5)
    assert probe is not None and (probe.action, probe.percent) == ("canary", 0.0)
    assert probe.slice is not None and probe.slice.key == "language=zh"
    assert [(h.key, h.action) for h in probe.slices] == [("language=zh", "canary")]
    for k in range(2):
        assert await walk.pair("zh", GOOD, now + 11 + k) is None
    restore = await walk.pair("zh", GOOD, now + 14)
    assert restore is not None and (restore.action, restore.target) == ("restore", "candidate")
    assert restore.slice is not None and restore.slices == ()
    assert (await walk.state()).held == {}
    assert len(walk.commands) == len(walk.alerts) == 3  # one each per transition


async def test_a_slice_that_keeps_failing_widens_to_the_route() -> None:
    walk = Walk()
    now = 0.0
    for i in range(200):
        now += 0.01
        if await walk.pair("zh" if i % 4 == 3 else "en", LOOP if i % 4 == 3 else GOOD, now):
            break
    assert await walk.tick(now + 11) is not None  # half-open
    widened = await walk.pair("zh", LOOP, now + 12)  # the probe fails: second trip
    assert widened is not None and widened.slice is None and widened.slices == ()
    assert (widened.action, widened.target) == ("rollback", "reference")
    assert "widened to the route: the slice tripped 2 times" in widened.reason
    state = await walk.state()
    assert state.state == "open" and state.held == {}


async def test_a_second_slice_widens_and_a_route_policy_never_scopes() -> None:
    two = RoutePolicy.model_validate({**POLICY.model_dump(), "widen_after_slices": 2})
    walk = Walk(two)
    now = 0.0
    for i in range(200):  # Chinese loops first: held alone
        now += 0.01
        if await walk.pair("zh" if i % 4 == 3 else "en", LOOP if i % 4 == 3 else GOOD, now):
            break
    assert walk.commands[-1].slice is not None
    second = None
    for i in range(200):  # then Japanese: a second slice would be held
        now += 0.01
        second = await walk.pair("ja" if i % 4 == 3 else "en", LOOP if i % 4 == 3 else GOOD, now)
        if second is not None:
            break
    assert second is not None and second.slice is None and second.action == "rollback"
    assert "widened to the route: 2 slices would be rolled back" in second.reason
    assert (await walk.state()).held == {}

    whole = Walk(RoutePolicy.model_validate({**POLICY.model_dump(), "rollback_scope": "route"}))
    command = None
    for i in range(200):
        now += 0.01
        command = await whole.pair("zh" if i % 4 == 3 else "en", LOOP if i % 4 == 3 else GOOD, now)
        if command is not None:
            break
    assert command is not None and command.slice is None  # the default: the whole route


async def test_held_slices_survive_the_states_json_round_trip() -> None:
    walk = Walk()
    now = 0.0
    for i in range(200):
        now += 0.01
        if await walk.pair("zh" if i % 4 == 3 else "en", LOOP if i % 4 == 3 else GOOD, now):
            break
    state = await walk.state()
    assert RouteState.from_json(json.loads(json.dumps(state.to_json()))) == state
