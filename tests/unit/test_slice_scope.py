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
from quantdrift.breaker.policy import RoutePolicy
from support.slice_walk import SliceWalk

POLICY = RoutePolicy(
    rollback_scope="slice",
    slice_dimensions=("language",),
    slice_min_pairs=5,
    min_pairs=5,
    cooldown_s=10.0,
    half_open_pairs=3,
)


def policy(**changes: object) -> RoutePolicy:
    return RoutePolicy.model_validate({**POLICY.model_dump(), **changes})


async def test_a_chinese_drift_rolls_back_chinese_alone_then_half_opens_and_restores() -> None:
    walk = SliceWalk(POLICY)
    command = await walk.until_command("zh")
    assert command.action == "rollback" and command.target == "reference"
    assert command.slice is not None and command.slice.key == "language=zh"
    assert [(h.key, h.action) for h in command.slices] == [("language=zh", "rollback")]
    assert command.evidence["rule"] == "tolerance:hard@language=zh"
    assert command.evidence["slice"]["pairs"] >= 5
    assert walk.alerts[-1].startswith("r [slice language=zh]: closed -> open (rollback to the ")
    state = await walk.state()
    assert state.state == "closed" and state.target == "candidate"
    assert state.held["language=zh"].state == "open"

    # English keeps being judged (no command); a Chinese pair in flight is ignored.
    opened = walk.now
    assert await walk.pair("en", False) is None
    assert await walk.pair("zh", True) is None
    assert (await walk.state()).last_decision == "ignored@language=zh"
    assert await walk.tick(opened + 5) is None  # cool-down not over

    probe = await walk.tick(opened + 10.5)
    assert probe is not None and (probe.action, probe.percent) == ("canary", 0.0)
    assert probe.slice is not None and probe.slice.key == "language=zh"
    assert [(h.key, h.action) for h in probe.slices] == [("language=zh", "canary")]
    for _ in range(2):
        assert await walk.pair("zh", False) is None
    restore = await walk.pair("zh", False)
    assert restore is not None and (restore.action, restore.target) == ("restore", "candidate")
    assert restore.slice is not None and restore.slices == ()
    assert (await walk.state()).held == {}
    assert len(walk.commands) == len(walk.alerts) == 3  # one each per transition


async def test_a_slice_that_keeps_failing_widens_to_the_route() -> None:
    walk = SliceWalk(POLICY)
    await walk.until_command("zh")
    assert await walk.tick(walk.now + 11) is not None  # half-open
    widened = await walk.pair("zh", True)  # the probe fails: the slice's second trip
    assert widened is not None and widened.slice is None and widened.slices == ()
    assert (widened.action, widened.target) == ("rollback", "reference")
    assert "widened to the route: the slice tripped 2 times" in widened.reason
    state = await walk.state()
    assert state.state == "open" and state.held == {}


async def test_with_one_trip_allowed_to_repeat_a_failed_probe_reopens_the_slice() -> None:
    walk = SliceWalk(policy(widen_after_trips=3))
    await walk.until_command("zh")
    opened_for = (await walk.state()).held["language=zh"].cooldown_s
    assert await walk.tick(walk.now + 11) is not None
    again = await walk.pair("zh", True)
    assert again is not None and again.slice is not None and again.action == "rollback"
    held = (await walk.state()).held["language=zh"]
    assert (held.state, held.trips, held.cooldown_s) == ("open", 2, opened_for * 2)


async def test_a_second_slice_widens_and_a_route_policy_never_scopes() -> None:
    walk = SliceWalk(policy(widen_after_slices=2))
    assert (await walk.until_command("zh")).slice is not None  # Chinese first: held alone
    second = await walk.until_command("ja")  # then Japanese: a second slice
    assert second.slice is None and second.action == "rollback"
    assert "widened to the route: 2 slices would be rolled back" in second.reason
    assert (await walk.state()).held == {}

    whole = SliceWalk(policy(rollback_scope="route"))
    command = await whole.until_command("zh")
    assert command.slice is None and command.slices == ()  # the default: the whole route


async def test_a_gateway_still_serving_the_held_slice_widens_the_rollback() -> None:
    # A gateway that cannot map the selector refuses the command (and counts it): its
    # Chinese users stay on the candidate, whose failing pairs keep coming. In flight
    # (built within slice_stray_grace_s of the trip) they are ignored; later, they widen.
    walk = SliceWalk(POLICY)
    await walk.until_command("zh")
    opened = walk.now
    assert await walk.pair("zh", True, at=opened + 59) is None  # in flight
    assert await walk.pair("zh", False, at=opened + 90) is None  # passing: no evidence
    widened = await walk.pair("zh", True, at=opened + 90)
    assert widened is not None and widened.slice is None and widened.action == "rollback"
    assert widened.evidence["rule"] == "stray@language=zh"
    assert "a gateway still serves the slice from the candidate" in widened.reason


async def test_held_slices_survive_the_states_json_round_trip() -> None:
    walk = SliceWalk(POLICY)
    await walk.until_command("zh")
    state = await walk.state()
    assert state.held
    assert RouteState.from_json(json.loads(json.dumps(state.to_json()))) == state
