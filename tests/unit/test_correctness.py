"""Correctness on checkable outcomes: each side is checked against the expected answer,
and a candidate that is wrong where the reference is right fails its task outcome even
when it agrees in form (a number, a JSON object, a label)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantdrift.breaker.machine import judge
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.state import RouteState
from quantdrift.detectors.correctness import answer_ok
from quantdrift.detectors.suite import score_event, score_pairs
from quantdrift.detectors.tolerance import outcome_x
from quantdrift.lab.corpus import build
from quantdrift.schemas.pair import ModelOutput, PairEvent, RequestInfo, ToolCall


@pytest.mark.parametrize(
    ("text", "expected", "kind", "want"),
    [
        ("Each box holds 12, so 3 boxes hold 36.", "36", "number", True),
        ("Each box holds 12, so 3 boxes hold 35.", "36", "number", False),
        ("答案是 1,024。", "1024", "number", True),
        ("The result is 2.50", "2.5", "number", True),
        ("no number here", "36", "number", False),
        ('{"sku": "A-1", "quantity": 2, "ship_to_city": "Lyon"}',
         '{"quantity": 2, "ship_to_city": "lyon", "sku": "A-1"}', "json", True),
        ('{"sku": "A-1", "quantity": 3}', '{"quantity": 2, "sku": "A-1"}', "json", False),
        ('{"sku": "A-1"', '{"sku": "A-1"}', "json", False),
        ("Category: Billing", "billing", "label", True),
        ("Category: shipping", "billing", "label", False),
        ("她搬到了 上海。", "上海", "text", True),
        ("anything", None, "text", None),
        ("anything", "{not json", "json", None),
    ],
)  # fmt: skip
def test_each_kind_is_checked_as_stated(
    text: str, expected: str | None, kind: str, want: bool | None
) -> None:
    assert answer_ok(text, expected, kind) is want


def pair(candidate: str, reference: str, expected: str | None, kind: str | None) -> PairEvent:
    return PairEvent(
        pair_id="p", ts=0.0, route="r",
        candidate=ModelOutput(text=candidate, finish_reason="stop"),
        reference=ModelOutput(text=reference, finish_reason="stop"),
        request=RequestInfo(expected_answer=expected, answer_kind=kind, temperature=0.0),
    )  # fmt: skip


def test_a_wrong_number_fails_the_outcome_where_agreement_alone_cannot_tell() -> None:
    wrong = pair("3 boxes of 12 hold 35 items.", "3 boxes of 12 hold 36 items.", "36", "number")
    m = score_pairs([wrong], None)[0]
    assert (m.answer_ok, m.reference_answer_ok) == (False, True)
    assert outcome_x(m) == 1.0  # the candidate failed where the reference did not
    both = pair("They hold 35.", "They hold 35.", "36", "number")  # both wrong: concordant
    assert outcome_x(score_pairs([both], None)[0]) == 0.5
    unchecked = pair("3 boxes of 12 hold 35 items.", "3 boxes of 12 hold 36 items.", None, None)
    m = score_pairs([unchecked], None)[0]
    assert m.answer_ok is None and outcome_x(m) == 0.5  # agreement only, as before


def test_the_outcome_test_rolls_back_a_candidate_that_gets_numbers_wrong() -> None:
    policy = RoutePolicy(min_pairs=5, slice_dimensions=())
    state, tripped = RouteState(), None
    for i in range(60):
        # Same form, one digit off: similar enough that no other test fires first.
        p = pair(f"The total is {100 + i + 1}.", f"The total is {100 + i}.", str(100 + i), "number")
        score = score_event(p.model_copy(update={"pair_id": f"p{i}"}), score_pairs([p], None)[0])
        decision = judge(policy, state, score, now=float(i))
        state = decision.state
        if decision.transition is not None:
            tripped = decision.transition
            break
    assert tripped is not None and tripped.rule.startswith("tolerance:outcomes"), tripped


def test_the_corpus_prompts_carry_their_checkable_answers() -> None:
    prompts = build.load(Path(__file__).resolve().parents[2] / "corpus" / "prompts.jsonl.gz")
    kinds = [p.checkable()[1] for p in prompts if p.checkable() is not None]
    assert {"number", "json", "label", "text"} <= set(kinds)
    assert len(kinds) >= len(prompts) // 3


def called(arguments: str, text: str = "") -> ModelOutput:
    """A side that answered with a function call (as the gateway records it)."""
    return ModelOutput(
        text=text,
        finish_reason="tool_calls",
        tool_calls=[ToolCall(name="place_order", arguments=arguments)],
    )


def tool_pair(candidate: ModelOutput, reference: ModelOutput) -> PairEvent:
    want = '{"sku": "SKU-26063", "quantity": 4, "ship_to_city": "Montebello"}'
    return PairEvent(
        pair_id="t", ts=0.0, route="r", candidate=candidate, reference=reference,
        request=RequestInfo(expected_answer=want, answer_kind="json", temperature=0.0),
    )  # fmt: skip


def test_a_tool_calls_arguments_are_the_answer_checked_and_the_contract_kept() -> None:
    right = '{"sku": "SKU-26063", "quantity": 4, "ship_to_city": "Montebello"}'
    wrong = '{"sku": "SKU-26063", "quantity": 3, "ship_to_city": "Montebello"}'
    m = score_pairs([tool_pair(called(wrong), called(right))], None)[0]
    assert (m.answer_ok, m.reference_answer_ok) == (False, True)
    assert (m.json_ok, m.reference_json_ok) == (True, True)  # both calls parse
    assert outcome_x(m) == 1.0  # wrong arguments where the reference's were right
    # Arguments that do not parse break the contract, named by the call.
    cut = score_pairs([tool_pair(called('{"sku": "SKU-26063", "quan'), called(right))], None)[0]
    assert cut.json_ok is False and (cut.json_error or "").startswith("tool call place_order:")
    assert outcome_x(cut) == 1.0
    # A call's text (often empty, sometimes a preamble) is not what is checked.
    chatty = called(right, text="Sure, placing the order now.")
    assert score_pairs([tool_pair(chatty, called(right))], None)[0].answer_ok is True
    # A side that answered in text is read as before.
    text = score_pairs([tool_pair(ModelOutput(text=right), called(right))], None)[0]
    assert (text.answer_ok, text.json_ok) == (True, None)


def test_a_pair_recorded_before_tool_calls_still_reads() -> None:
    old = PairEvent(
        pair_id="o", ts=0.0, route="r", candidate=ModelOutput(text="a"),
        reference=ModelOutput(text="a"),
    ).model_dump(mode="json")  # fmt: skip
    for side in ("candidate", "reference"):
        old[side].pop("tool_calls")
    assert "tool_calls" not in json.dumps(old)
    back = PairEvent.parse(json.dumps(old))
    assert back.candidate.tool_calls is None and back.reference.tool_calls is None
