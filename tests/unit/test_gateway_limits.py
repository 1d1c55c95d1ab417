"""Request limits, header hygiene, kept log-probs and RE2 schema regexes: pure parts."""

from __future__ import annotations

import time

import pytest

from quantdrift.detectors.json_contract import check_json_contract
from quantdrift.gateway.chain.planning import decoding_refusal
from quantdrift.gateway.http.edge import header_list
from quantdrift.gateway.openai_wire import Accumulator
from quantdrift.schemas.pair import RequestInfo


@pytest.mark.parametrize(
    ("body", "n", "param"),
    [
        ({"temperature": float("nan")}, 1, "temperature"),
        ({"top_p": float("inf")}, 1, "top_p"),
        ({"frequency_penalty": float("-inf")}, 1, "frequency_penalty"),
        ({"temperature": "0.5"}, 1, "temperature"),
        ({"temperature": True}, 1, "temperature"),
        ({"max_tokens": 0}, 1, "max_tokens"),
        ({"max_tokens": 1.5}, 1, "max_tokens"),
        ({"max_tokens": 600}, 2, "max_tokens"),
        ({"max_completion_tokens": 200}, 8, "max_completion_tokens"),
        ({"temperature": 0.7, "top_p": 1, "max_tokens": 500}, 2, None),
        ({}, 16, None),
    ],
)
def test_decoding_refusals(body: dict, n: int, param: str | None) -> None:
    refusal = decoding_refusal(body, n, max_total_tokens=1000)
    assert (refusal.param if refusal else None) == param
    if refusal:
        assert refusal.status == 400


@pytest.mark.parametrize(
    ("names", "header"),
    [
        (["top_k", "min_p"], "top_k,min_p"),
        (["evil\r\nx-injected: 1"], "+1-unprintable"),
        (["ключ", "ok"], "ok,+1-unprintable"),
        (["x" * 65], "+1-unprintable"),
        (["a b"], "+1-unprintable"),
    ],
)
def test_header_list_echoes_plain_tokens_only(names: list[str], header: str) -> None:
    assert header_list(names) == header
    header.encode("latin-1")  # always encodable


def _chunk(index: int, n_entries: int) -> dict:
    entries = [{"token": "t", "logprob": -0.1, "top_logprobs": []}] * n_entries
    return {
        "choices": [{"index": index, "delta": {"content": "t"}, "logprobs": {"content": entries}}]
    }


def test_kept_logprobs_are_bounded_and_other_choices_dropped_unless_asked() -> None:
    acc = Accumulator("int4", keep_logprobs=5, all_choices=False)
    for _ in range(4):
        acc.add(_chunk(0, 3))
        acc.add(_chunk(1, 3))
    done = acc.finish()
    assert len(done.choices[0].logprobs_content) == 5
    assert done.choices[1].logprobs_content == []
    assert done.completion_tokens == 24  # counted, though not kept
    every = Accumulator("int4", keep_logprobs=None, all_choices=True)
    every.add(_chunk(1, 3))
    assert len(every.finish().choices[0].logprobs_content) == 3


EVIL = "a" * 40 + "!"


@pytest.mark.parametrize(
    ("schema", "value", "ok"),
    [
        ({"properties": {"a": {"pattern": "^(a+)+$"}}}, {"a": EVIL}, False),
        ({"properties": {"a": {"pattern": "^(a+)+$"}}}, {"a": "aaa"}, True),
        ({"patternProperties": {"^(x+)+$": {"type": "integer"}}}, {"x" * 40 + "!": "s"}, True),
        ({"patternProperties": {"^x+$": {"type": "integer"}}}, {"xx": "s"}, False),
        (
            {"patternProperties": {"^(a+)+$": {}}, "additionalProperties": False},
            {EVIL: 1},
            False,
        ),
        ({"patternProperties": {"^a+$": {}}, "additionalProperties": False}, {"aa": 1}, True),
        ({"properties": {"d": {"pattern": "\\d"}}}, {"d": "x1"}, True),
    ],
)
def test_schema_regexes_run_in_linear_time(schema: dict, value: dict, ok: bool) -> None:
    import json

    t0 = time.perf_counter()
    result, error = check_json_contract(json.dumps(value), RequestInfo(json_schema=schema))
    assert time.perf_counter() - t0 < 0.5
    assert result is ok, error


@pytest.mark.parametrize("pattern", ["(a)\\1", "(?=a)a", "(?<!b)a"])
def test_patterns_re2_cannot_run_are_the_requests_fault(pattern: str) -> None:
    ok, error = check_json_contract(
        '{"a": "a"}', RequestInfo(json_schema={"properties": {"a": {"pattern": pattern}}})
    )
    assert ok is None and error is not None and "not supported" in error


async def test_a_public_placeholder_salt_is_an_error_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from quantdrift.gateway.gateway_config import parse_config
    from quantdrift.gateway.http.service import Gateway

    base = {
        "precisions": {"a": ["http://127.0.0.1:1"], "b": ["http://127.0.0.1:2"]},
        "routes": {"r": {"candidate": "a", "reference": "b"}},
    }
    for salts, loud in (
        ({"sample_salt": "replace-me-with-a-secret"}, True),
        ({"prompt_salt": "short"}, True),
        ({"sample_salt": "a-real-secret-of-some-length"}, False),
        ({}, False),  # a random salt per process
    ):
        caplog.clear()
        gw = Gateway(parse_config({**base, **salts}))
        with caplog.at_level(logging.ERROR, "quantdrift.gateway.http.service"):
            await gw.start()
            await gw.stop(0.1)
        said = any("prompt salt" in r.getMessage() for r in caplog.records)
        assert said is loud, salts
