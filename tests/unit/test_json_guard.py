"""JsonGuard: table-driven cases and hypothesis properties over chunked documents."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quantdrift.gateway.guards.json_guard import JsonGuard, guard_for

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=6), children, max_size=5)
    ),
    max_leaves=25,
)
# Never valid outside a string, wherever they are inserted.
GARBAGE = "#@;=<>'%"


def render(value: object, indent: int | None, ascii_: bool) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ascii_)


def chunks(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def outside_string_positions(text: str) -> list[int]:
    """Indices (0..len) where an inserted character would sit outside any string."""
    positions, in_string, escaped = [], False, False
    for i, ch in enumerate(text):
        if not in_string:
            positions.append(i)
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
    positions.append(len(text))
    return positions


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_VALUES, st.sampled_from([None, 0, 2]), st.booleans(), st.lists(st.integers(0, 10**6)))
def test_valid_documents_in_any_chunks_are_accepted(value, indent, ascii_, cuts) -> None:
    text = render(value, indent, ascii_)
    guard = JsonGuard(max_whitespace_run=None, max_depth=1000)
    for piece in chunks(text, cuts):
        assert guard.feed(piece).ok, (text, guard.result)
    assert guard.close().ok, (text, guard.result)
    start, end = guard.span  # type: ignore[misc]
    assert json.loads(text[start:end]) == json.loads(text)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.data())
def test_garbage_fails_exactly_at_the_first_impossible_character(value, data) -> None:
    text = render(value, None, False)
    at = data.draw(st.sampled_from(outside_string_positions(text)))
    bad = data.draw(st.sampled_from(GARBAGE))
    broken = text[:at] + bad + text[at:]
    guard = JsonGuard(max_whitespace_run=None, max_depth=1000)
    results = [guard.feed(p) for p in chunks(broken, data.draw(st.lists(st.integers(0, 10**6))))]
    assert not results[-1].ok
    assert results[-1].position == at, (broken, results[-1])


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES, st.data())
def test_truncations_never_fail_early_and_fail_at_the_close(value, data) -> None:
    text = render(value, None, False)
    cut = data.draw(st.integers(0, len(text) - 1))
    prefix = text[:cut]
    guard = JsonGuard(max_whitespace_run=None, max_depth=1000)
    assert guard.feed(prefix).ok
    try:
        json.loads(prefix)
        complete = bool(prefix.strip())
    except ValueError:
        complete = False
    assert guard.close().ok == complete, (prefix, guard.result)


@settings(max_examples=150, deadline=None)
@given(JSON_VALUES, st.data())
def test_a_raw_control_character_in_a_string_fails_there(value, data) -> None:
    text = render(value, None, False)
    quotes = [i for i, ch in enumerate(text) if ch == '"' and (i == 0 or text[i - 1] != "\\")]
    if not quotes:
        return
    at = data.draw(st.sampled_from(quotes)) + 1  # just inside an opening or after a closing quote
    broken = text[:at] + "\x01" + text[at:]
    guard = JsonGuard(max_whitespace_run=None, max_depth=1000)
    result = guard.feed(broken)
    assert not result.ok and result.position == at


@pytest.mark.parametrize(
    ("text", "kwargs", "reason", "at_close"),
    [
        ('{"a": 1}', {}, None, False),
        ("  \n" + '{"a": 1}' + "\n ", {}, None, False),
        ('```json\n{"a": 1}\n```', {}, None, False),
        ("```\n[1, 2]\n```\n", {}, None, False),
        ('{"a": 1', {}, "truncated", True),
        ("", {}, "empty", True),
        ('{"a": 1}}', {}, "trailing_content", False),
        ('{"a": 1} {"b": 2}', {}, "trailing_content", False),
        ('{"a": 1, "a": 2}', {}, "duplicate_key", False),
        ('{"x": {"a": 1, "a": 2}}', {}, "duplicate_key", False),
        ('{"a": 1, "\\u0061": 2}', {}, "duplicate_key", False),  # same key, escaped
        ('{"a":' + " " * 65 + "1}", {}, "whitespace_run", False),
        ('{"a":' + " " * 64 + "1}", {}, None, False),
        ('{"a":' + " " * 65 + "1}", {"max_whitespace_run": None}, None, False),
        ('{"s": "' + " " * 200 + '"}', {}, None, False),  # inside a string: not structural
        ("[" * 65 + "]" * 65, {}, "too_deep", False),
        ("[" * 64 + "]" * 64, {}, None, False),
        ("[[[1]]]", {"max_depth": 2}, "too_deep", False),
        ('{"a": 1}', {"required_keys": ["a", "b"]}, "missing_key", False),
        ('{"x": {"b": 1}}', {"required_keys": ["b"]}, "missing_key", False),
        ("[1]", {"require_object": True}, "not_object", False),
        ("Sure! Here is", {}, "invalid_char", False),
        ('{"a": tru}', {}, "invalid_literal", False),
        ('{"a": nul', {}, "truncated", True),
        ('{"a": 01}', {}, "invalid_number", False),
        ('{"a": 1.}', {}, "invalid_number", False),
        ('{"a": -}', {}, "invalid_number", False),
        ('{"a": 1e+}', {}, "invalid_number", False),
        ("-12.5e-3", {}, None, False),
        ("12", {}, None, False),
        ('{"a": "\\x"}', {}, "bad_escape", False),
        ('{"a": "\\u12G4"}', {}, "bad_escape", False),
        ('{"a" 1}', {}, "invalid_char", False),
        ("[1, 2,]", {}, "invalid_char", False),
        ("[1}", {}, "invalid_char", False),
        ("{'a': 1}", {}, "invalid_char", False),
        ("``json\n{}", {}, "invalid_char", False),
        ('```json\n{"a": 1}\n``` more', {}, "trailing_content", False),
    ],
)
def test_cases(text: str, kwargs: dict, reason: str | None, at_close: bool) -> None:
    guard = JsonGuard(**kwargs)
    fed = guard.feed(text)
    assert fed.ok == (reason is None or at_close), fed
    closed = guard.close()
    assert closed.reason == reason
    if reason is not None and not at_close:
        assert closed.position is not None


def test_the_span_is_the_bare_value_and_failure_is_sticky() -> None:
    text = '```json\n{"a": [1, 2]}\n```'
    guard = JsonGuard()
    for ch in text:
        assert guard.feed(ch).ok
    assert guard.close().ok and guard.complete
    start, end = guard.span  # type: ignore[misc]
    assert text[start:end] == '{"a": [1, 2]}'
    bad = JsonGuard()
    first = bad.feed("{x")
    assert bad.feed('"a": 1}') is first and bad.close() is first and first.position == 1


def test_guard_for_reads_expected_keys_and_the_schema() -> None:
    schema = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
    guard = guard_for(expected_keys=["age"], json_schema=schema)
    assert guard.required_keys == ("age", "name") and guard.require_object
    assert not guard_for().require_object


def test_cost_is_linear() -> None:
    big = json.dumps({f"k{i}": ["x" * 50, i, {"n": None}] for i in range(2000)})
    guard = JsonGuard()
    for i in range(0, len(big), 7):
        assert guard.feed(big[i : i + 7]).ok
    assert guard.close().ok and guard.consumed == len(big)
