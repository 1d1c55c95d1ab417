"""The corpus recorder puts each prompt's checkable answer on its pairs, and the worker's
scoring checks both sides against it: the recorder against a scripted engine pair
(``lab`` teacher forcing on ``/v1/score``), no model to load."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from quantdrift.detectors.suite import score_pairs
from quantdrift.detectors.tolerance import outcome_x
from quantdrift.lab.corpus.families import CorpusPrompt
from quantdrift.lab.corpus.record import REFERENCE, CorpusRecorder
from support.scripted_llm import ScriptedLLM

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WORD_PROBLEM = CorpusPrompt(
    prompt_id="wp-1", family="word_problem", language="en",
    messages=[{"role": "user", "content": "3 boxes of 12 eggs: how many eggs?"}],
    decoding="greedy", max_tokens=32, output_kind="number", answer="36",
)  # fmt: skip
FREE_TEXT = CorpusPrompt(
    prompt_id="cs-1", family="customer_service", language="en",
    messages=[{"role": "user", "content": "What is my total?"}],
    decoding="sampled", max_tokens=96, output_kind="text", answer="42.5",
)  # fmt: skip


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    server.texts.update({"ref": "3 boxes of 12 make 36 eggs.", "int3": "They hold 35 eggs."})
    try:
        yield server
    finally:
        server.stop()


async def test_recorded_pairs_carry_the_answer_and_each_side_is_checked(llm: ScriptedLLM) -> None:
    urls = {REFERENCE: f"{llm.url}/ref", "int3": f"{llm.url}/int3"}
    models = {REFERENCE: "m-ref", "int3": "m-int3"}
    async with CorpusRecorder(urls, models, ["int3"], teacher_forcing="lab") as rec:
        pairs = await rec.block([WORD_PROBLEM, FREE_TEXT])
    shadow = {p.pair_id: p for p in pairs if p.kind == "shadow"}
    wp, cs = shadow["wp-1-int3"], shadow["cs-1-int3"]
    assert (wp.request.expected_answer, wp.request.answer_kind) == ("36", "number")
    assert cs.request.expected_answer is None  # a number among a free answer's figures
    assert wp.reference_logprobs_on_candidate  # forced on the scripted /v1/score
    m = score_pairs([wp], None)[0]
    assert (m.answer_ok, m.reference_answer_ok) == (False, True)
    assert outcome_x(m) == 1.0
