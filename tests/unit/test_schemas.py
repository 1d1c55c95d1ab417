"""Every message model: round trips, refusals with readable reasons, exported JSON Schemas."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantdrift.errors import SchemaError
from quantdrift.schemas import (
    AlertEvent,
    DeadLetter,
    DegradationEvent,
    Metrics,
    PairEvent,
    RouteCommand,
    ScoreEvent,
    SignedCommand,
)
from quantdrift.schemas.export import MESSAGES, export_schemas

PAIR = {
    "pair_id": "p1",
    "ts": 1.5,
    "route": "cs-agent/int4",
    "candidate": {"text": "巴黎是法国的首都。", "entropy": [0.1, 0.2], "precision": "int4"},
    "reference": {"text": "法国的首都是巴黎。", "precision": "bf16"},
    "request": {"temperature": 0.7, "expected_keys": ["a"]},
}

EXAMPLES = {
    "PairEvent": PairEvent.parse(PAIR),
    "ScoreEvent": ScoreEvent(
        pair_id="p1", route="r", kind="shadow", ts=1.0, metrics=Metrics(cosine=0.9, rougeL=0.5)
    ),
    "RouteCommand": RouteCommand(
        command_id="r#1",
        route="r",
        action="rollback",
        target="reference",
        target_precision="bf16",
        epoch=1,
        issued_at=2.0,
    ),
    "SignedCommand": SignedCommand(key_id="k1", signature="ab" * 32, payload="{}"),
    "AlertEvent": AlertEvent(
        alert_id="r#1",
        severity="P1",
        route="r",
        kind="breaker.open",
        summary="s",
        ts=2.0,
        dedupe_key="r:open:1",
    ),
    "DeadLetter": DeadLetter.of(b"\xff", topic="t", error="invalid JSON", now=3.0),
    "DegradationEvent": DegradationEvent(
        event_id="e", route="r", precision="int4", reason="json", ts=4.0
    ),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_round_trip_and_version(name: str) -> None:
    message = EXAMPLES[name]
    again = type(message).parse(message.dumps())
    assert again == message and again.schema_version == 1


def test_decoding_mode_follows_temperature() -> None:
    assert PairEvent.parse(PAIR).request.decoding == "sampled"
    greedy = {**PAIR, "request": {"temperature": 0}}
    assert PairEvent.parse(greedy).request.decoding == "greedy"


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"{", "invalid JSON"),
        (b"[]", "schema"),
        (json.dumps({**PAIR, "ts": "soon"}).encode(), "ts"),
        (json.dumps({k: v for k, v in PAIR.items() if k != "candidate"}).encode(), "candidate"),
        (json.dumps(PAIR).replace("[0.1, 0.2]", "[NaN]").encode(), "invalid JSON"),
        (json.dumps({**PAIR, "candidate": {"text": "x", "entropy": [-1]}}).encode(), "entropy"),
        (json.dumps({**PAIR, "route": "bad route with spaces"}).encode(), "route"),
        (json.dumps({**PAIR, "schema_version": 2}).encode(), "schema_version"),
        (json.dumps({**PAIR, "candidate": {"text": "x" * 200_001}}).encode(), "text"),
        (
            json.dumps({**PAIR, "request": {"private": True, "prompt": "secret"}}).encode(),
            "private",
        ),
        (b"\xff\xfe", "invalid JSON"),
    ],
)
def test_bad_pairs_are_refused_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(SchemaError) as info:
        PairEvent.parse(raw)
    assert reason in str(info.value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_schema_error(raw: bytes) -> None:
    with contextlib.suppress(SchemaError):
        PairEvent.parse(raw)


def test_exported_schemas_validate_the_examples(tmp_path: Path) -> None:
    paths = export_schemas(tmp_path)
    assert {p.name for p in paths} == {f"{n}.v1.schema.json" for n in MESSAGES}
    for name, message in EXAMPLES.items():
        schema = json.loads((tmp_path / f"{name}.v1.schema.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(json.loads(message.dumps()))


def test_dead_letter_keeps_the_exact_bytes() -> None:
    letter = DeadLetter.parse(DeadLetter.of(b"\x00\xffabc", topic="t", error="e" * 5000).dumps())
    assert letter.original() == b"\x00\xffabc" and len(letter.error) == 2000
