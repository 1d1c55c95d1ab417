"""JSON contract: fences, keys, schema, duplicate keys, garbage."""

from __future__ import annotations

from typing import Any

import pytest

from quantdrift.detectors.json_contract import check_json_contract, strip_fences
from quantdrift.schemas import RequestInfo

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name"],
}


@pytest.mark.parametrize(
    ("text", "request_", "ok", "error_part"),
    [
        ("anything", RequestInfo(), None, None),
        ('{"a": 1}', RequestInfo(expects_json=True), True, None),
        ('```json\n{"a": 1}\n```', RequestInfo(expects_json=True), True, None),
        ("```\n[1, 2]\n```\n", RequestInfo(expects_json=True), True, None),
        ("Sure! Here it is: {", RequestInfo(expects_json=True), False, "json: invalid"),
        ("", RequestInfo(expects_json=True), False, "json: invalid"),
        ('{"a": NaN}', RequestInfo(expects_json=True), False, "json: invalid"),
        ('{"name": "x"}', RequestInfo(expected_keys=["name"]), True, None),
        ('{"name": "x"}', RequestInfo(expected_keys=["name", "age"]), False, "missing key 'age'"),
        ("[1]", RequestInfo(expected_keys=["name"]), False, "expected an object"),
        ('{"name": "x", "age": 3}', RequestInfo(json_schema=SCHEMA), True, None),
        (
            '{"age": 3}',
            RequestInfo(json_schema=SCHEMA),
            False,
            "json: schema: 'name' is a required",
        ),
        ('{"name": "x", "age": -1}', RequestInfo(json_schema=SCHEMA), False, "at $.age"),
        # A looping model repeats keys; json.loads would quietly keep the last one.
        (
            '{"name": "x", "name": "x", "name": "x"}',
            RequestInfo(expects_json=True),
            False,
            "duplicate key 'name'",
        ),
        (
            '{"name": "x", "name": "x", "name": "x", "name',
            RequestInfo(expects_json=True),
            False,
            "json: invalid",
        ),
        ("[" * 100_000, RequestInfo(expects_json=True), False, "json: invalid"),
        ('{"a": 1}', RequestInfo(json_schema={"type": "nonsense"}), None, "invalid schema"),
    ],
)
def test_contract(
    text: str, request_: RequestInfo, ok: bool | None, error_part: str | None
) -> None:
    got_ok, error = check_json_contract(text, request_)
    assert got_ok is ok
    if error_part is None:
        assert error is None
    else:
        assert error is not None and error_part in error
        assert len(error) <= 160


@pytest.mark.parametrize(
    ("text", "body"),
    [
        ('```json\n{"a": 1}\n```', '{"a": 1}'),
        ('```JSON {"a": 1}```', '{"a": 1}'),
        ("  [1]\n", "[1]"),
        ("no fence", "no fence"),
    ],
)
def test_strip_fences(text: str, body: str) -> None:
    assert strip_fences(text) == body
