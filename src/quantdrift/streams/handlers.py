"""Pure steps of the agents: parse a batch of pairs, open a score record.

No Kafka, no Redis here: agents read records, call these, and write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from quantdrift.errors import SchemaError, SignatureError
from quantdrift.schemas import CommandVerifier, DeadLetter, PairEvent, ScoreEvent
from quantdrift.schemas.privacy import prompt_hash
from quantdrift.schemas.record_keys import pair_key_error


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One Kafka record as the agent received it; enough to dead-letter it whole."""

    value: bytes | None
    key: bytes | None
    topic: str
    partition: int | None
    offset: int | None

    @classmethod
    def of_event(cls, event: Any) -> RawRecord:
        """A Faust event as the pure steps take it (with what the DLQ needs to locate it)."""
        m = event.message
        return cls(event.value, event.key, m.topic, m.partition, m.offset)

    def dead_letter(self, error: str, now: float, value: bytes | None = None) -> DeadLetter:
        """This record for the DLQ, where it came from and why; ``value`` replaces the
        bytes kept (a private prompt's redacted pair), else they are kept whole."""
        kept = self.value if value is None else value
        where = {"partition": self.partition, "offset": self.offset}
        return DeadLetter.of(kept, topic=self.topic, key=self.key, error=error, now=now, **where)


def parse_batch(
    records: Sequence[RawRecord], now: float, prompt_salt: str = ""
) -> tuple[list[PairEvent], list[DeadLetter]]:
    """Split a batch into valid pairs and dead letters (with the reason), losing nothing.

    ``prompt_salt``: the salt of the prompt hash a private prompt is replaced by in the DLQ.
    """
    pairs: list[PairEvent] = []
    dead: list[DeadLetter] = []
    for rec in records:
        try:
            if rec.value is None:
                raise SchemaError("empty record (tombstone)")
            pair = PairEvent.parse(rec.value)
            key_error = pair_key_error(rec.key, pair)
            if key_error is not None:
                raise SchemaError(key_error)
        except SchemaError as exc:
            value, error = rec.value, str(exc)
            redacted = redact_private_prompt(rec.value, prompt_salt)
            if redacted is not None:
                value, error = redacted, error + " (prompt replaced by its salted hash)"
            dead.append(rec.dead_letter(error, now, value))
            continue
        pairs.append(pair)
    return pairs, dead


def redact_private_prompt(raw: bytes | None, salt: str = "") -> bytes | None:
    """A pair marked private must not carry its prompt anywhere, the DLQ included.

    The DLQ keeps original bytes so nothing is lost; for a private prompt the one
    exception is the prompt itself, replaced by ``prompt_hash`` (the gateway's hash,
    so the letter joins its pairs under one salt). None when there is
    nothing to redact (or the bytes are not a JSON object).
    """
    if not raw:
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    request = data.get("request") if isinstance(data, dict) else None
    if not (isinstance(request, dict) and request.get("private") and request.get("prompt")):
        return None
    prompt = request.pop("prompt")
    request["prompt_hash"] = prompt_hash(str(prompt), salt)
    return orjson.dumps(data)


def parse_score(
    rec: RawRecord, now: float, verifier: CommandVerifier, max_age_s: float
) -> ScoreEvent | DeadLetter:
    """A score the judge may fold, or a dead letter saying why not.

    Only a score signed by a worker's key, recent enough for dedupe to catch a
    replay, is folded: anyone who can write to the topic could otherwise make the
    breaker sign rollbacks. Unreadable, unsigned, forged and stale scores are
    dead-lettered whole with the reason (the verifier counts each reason).
    """
    try:
        if rec.value is None:
            raise SchemaError("empty record (tombstone)")
        score = verifier.open_score(rec.value, now, max_age_s)
        if rec.key is not None and rec.key.decode("utf-8", "replace") != score.route:
            raise SchemaError(
                f"record key {rec.key[:200]!r} differs from route {score.route!r}: "
                "scores must be keyed by route so one partition judges a route"
            )
        return score
    except (SchemaError, SignatureError) as exc:
        return rec.dead_letter(str(exc), now)
