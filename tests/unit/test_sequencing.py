"""The score agent's sequencer: a route's outcomes leave in arrival order, others do not wait."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quantdrift.streams.sequencing import RouteSequencer


@pytest.mark.parametrize(
    ("settle", "released"),
    [
        # The escalated a0 settles last: a1 waits for it, b0 does not.
        (["a1", "b0", "a0"], [[], ["b0"], ["a0", "a1"]]),
        (["a0", "a1", "b0"], [["a0"], ["a1"], ["b0"]]),
        (["b0", "a1", "a0"], [["b0"], [], ["a0", "a1"]]),
    ],
)
def test_release_waits_only_for_the_same_route(
    settle: list[str], released: list[list[str]]
) -> None:
    seq: RouteSequencer[str] = RouteSequencer()
    for ticket in ["a0", "a1", "b0"]:
        seq.add(ticket, ticket[0])
    got = []
    for ticket in settle:
        seq.settle(ticket, ticket)
        got.append(seq.release())
    assert got == released
    assert len(seq) == 0


def test_a_ticket_is_queued_once_and_settled_only_when_queued() -> None:
    seq: RouteSequencer[int] = RouteSequencer()
    seq.add(1, "r")
    with pytest.raises(ValueError, match="already queued"):
        seq.add(1, "r")
    with pytest.raises(KeyError):
        seq.settle(2, 0)


@given(
    routes=st.lists(st.sampled_from("abc"), min_size=1, max_size=30),
    data=st.data(),
)
def test_every_outcome_leaves_once_in_its_routes_arrival_order(routes: list[str], data) -> None:  # type: ignore[no-untyped-def]
    """Whatever order outcomes settle in (the escalations' timing), each route's leave in
    the order they were added; the settle order, which follows values, never shows."""
    seq: RouteSequencer[int] = RouteSequencer()
    for i, route in enumerate(routes):
        seq.add(i, route)
    order = data.draw(st.permutations(range(len(routes))))
    out: list[int] = []
    for i in order:
        seq.settle(i, i)
        out.extend(seq.release())
    assert sorted(out) == list(range(len(routes)))
    for route in set(routes):
        mine = [i for i in out if routes[i] == route]
        assert mine == sorted(mine)
    assert len(seq) == 0
