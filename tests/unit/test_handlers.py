"""The score agent's pure steps: parsing a batch into pairs and dead letters."""

from __future__ import annotations

import json

from quantdrift.schemas import DeadLetter
from quantdrift.schemas.privacy import prompt_hash
from quantdrift.streams.handlers import RawRecord, parse_batch, redact_private_prompt

PAIR = {
    "pair_id": "p1",
    "ts": 1.0,
    "route": "r/int4",
    "candidate": {"text": "a"},
    "reference": {"text": "b"},
}


def rec(value: bytes | None, key: bytes | None = b"r/int4", offset: int = 0) -> RawRecord:
    return RawRecord(value, key, "pairs", 0, offset)


def test_batch_splits_valid_pairs_from_dead_letters_losing_nothing() -> None:
    good = json.dumps(PAIR).encode()
    records = [rec(good), rec(b"{oops", offset=1), rec(None, offset=2), rec(good, b"x", offset=3)]
    pairs, dead = parse_batch(records, now=5.0)
    assert [p.pair_id for p in pairs] == ["p1"]
    assert [d.offset for d in dead] == [1, 2, 3]
    assert dead[0].original() == b"{oops" and "invalid JSON" in dead[0].error
    assert "tombstone" in dead[1].error and "names neither pair" in dead[2].error
    assert all(isinstance(d, DeadLetter) and d.ts == 5.0 for d in dead)


def test_private_prompt_never_reaches_the_dlq_in_clear() -> None:
    leaked = json.dumps({**PAIR, "request": {"private": True, "prompt": "my card 4111"}}).encode()
    _, dead = parse_batch([rec(leaked)], now=1.0, prompt_salt="dlq-salt-0123456789")
    assert b"4111" not in dead[0].original()
    hashed = json.loads(dead[0].original())["request"]["prompt_hash"]
    # The gateway's hash: a dead letter joins its pairs under the shared salt.
    assert hashed == prompt_hash("my card 4111", "dlq-salt-0123456789")
    assert "private" in dead[0].error and "salted hash" in dead[0].error


def test_redaction_leaves_other_messages_alone() -> None:
    assert redact_private_prompt(b"{oops") is None
    assert redact_private_prompt(json.dumps(PAIR).encode()) is None
    assert redact_private_prompt(b"[1, 2]") is None


def test_a_pair_keyed_by_its_id_or_its_route_is_accepted() -> None:
    """Pairs are keyed by pair_id so one route spreads over workers; route keys still work."""
    good = json.dumps(PAIR).encode()
    pairs, dead = parse_batch([rec(good, b"p1"), rec(good, b"r/int4", 1), rec(good, None, 2)], 1.0)
    assert len(pairs) == 3 and dead == []
