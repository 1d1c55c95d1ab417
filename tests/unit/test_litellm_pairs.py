"""PairJoiner: a LiteLLM call and its silent_model mirror become one pair, in either order."""

from __future__ import annotations

from quantdrift.integrations.litellm_pairs import PairJoiner, RouteMap, Side, output_of
from quantdrift.schemas.pair import ModelOutput, ToolCall

ROUTE = RouteMap("cs-agent/int4", "cs-agent", "cs-agent-bf16", "int4", "bf16")
REQUEST = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def side(group: str, primary: bool, expects: bool = True, text: str = "x") -> Side:
    return Side(group, ModelOutput(text=text, model=group), REQUEST, primary, expects)


def joiner() -> PairJoiner:
    return PairJoiner([ROUTE], timeout_s=5.0, salt="s")


def test_either_order_gives_one_pair_oriented_by_group() -> None:
    for first, second in (
        (side("cs-agent", True, text="c"), side("cs-agent-bf16", False, text="r")),
        (side("cs-agent-bf16", False, text="r"), side("cs-agent", True, text="c")),
    ):
        j = joiner()
        assert j.add("j1", first, now=0.0) is None
        pair = j.add("j1", second, now=1.0)
        assert pair is not None
        assert (pair.candidate.text, pair.reference.text) == ("c", "r")
        assert pair.pair_id == "j1:shadow" and pair.route == ROUTE.route
        assert pair.request.prompt is None and pair.request.prompt_hash
        assert pair.request.decoding == "greedy"
        assert j.pending() == 0 and j.stats.pairs == 1


def test_a_missing_mirror_is_counted_after_the_timeout() -> None:
    j = joiner()
    j.add("j1", side("cs-agent", True), now=0.0)
    assert j.expire(now=4.9) == [] and j.stats.mirrors_missing == 0
    assert j.expire(now=5.0) == ["j1"] and j.stats.mirrors_missing == 1


def test_a_mirror_without_its_primary_is_an_orphan_not_a_missing_mirror() -> None:
    j = joiner()
    j.add("j1", side("cs-agent-bf16", False), now=0.0)
    j.expire(now=10.0)
    assert (j.stats.orphan_mirrors, j.stats.mirrors_missing) == (1, 0)


def test_a_call_that_expects_no_mirror_waits_for_nothing() -> None:
    j = joiner()
    assert j.add("j1", side("cs-agent-bf16", True, expects=False), now=0.0) is None
    assert j.pending() == 0
    j.expire(now=10.0)
    assert j.stats.mirrors_missing == 0


def test_a_failed_mirror_ends_the_wait_and_is_counted() -> None:
    j = joiner()
    j.add("j1", side("cs-agent", True), now=0.0)
    j.mirror_failed("j1")
    j.expire(now=10.0)
    assert (j.stats.mirrors_failed, j.stats.mirrors_missing, j.pending()) == (1, 0, 0)


def test_an_unknown_group_is_counted() -> None:
    j = joiner()
    assert j.add("j1", side("other", True), now=0.0) is None
    assert j.stats.unmapped == 1


def test_a_litellm_side_records_its_tool_calls() -> None:
    """The hook folds a response through the gateway's wire code: its calls reach the pair."""
    call = {"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    response = {"id": "c", "model": "m", "choices": [
        {"index": 0, "message": message, "finish_reason": "tool_calls"}
    ]}  # fmt: skip
    out = output_of(response, "int4", 1.0, 0)
    assert out.tool_calls == [ToolCall(name="f", arguments='{"a": 1}')] and out.text == ""
