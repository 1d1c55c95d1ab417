"""One bounded producer, two encoders: pairs and degradation events (no broker)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from quantdrift.config import KafkaSettings
from quantdrift.errors import SchemaError
from quantdrift.gateway.shadow.producer import BoundedProducer
from quantdrift.gateway.shadow.publisher import (
    DegradationPublisher,
    ShadowPublisher,
    encode_degradation,
    encode_pair,
)
from quantdrift.schemas.degradation import DegradationEvent
from quantdrift.schemas.pair import PairEvent
from quantdrift.schemas.privacy import prompt_hash

KAFKA = KafkaSettings(bootstrap_servers="127.0.0.1:1")


def pair(prompt: str = "secret question") -> PairEvent:
    side = {"text": "a", "model": "m", "precision": "int4"}
    return PairEvent.parse(
        {
            "pair_id": "p1",
            "ts": 1.0,
            "route": "r/int4",
            "candidate": side,
            "reference": {**side, "precision": "bf16"},
            "request": {"prompt": prompt},
        }
    )


def event() -> DegradationEvent:
    return DegradationEvent(
        event_id="e1", route="r/int4", precision="int4", reason="json_invalid", ts=1.0
    )


class FakeKafka:
    """What ``AIOKafkaProducer.send`` does: hand back a delivery future."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    async def send(self, topic: str, key: bytes, value: bytes) -> asyncio.Future[None]:
        self.sent.append((topic, key, value))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def stop(self) -> None:
        return None


def test_a_pair_keeps_its_prompt_unless_hashing_or_private() -> None:
    key, value = encode_pair(pair())
    assert b"secret question" in value and key
    salt = "s" * 32
    private = pair().model_dump(mode="json")
    private["request"]["private"] = True  # a PairEvent refuses this; a mapping may carry it
    for hashed in (
        encode_pair(pair(), hash_prompts=True, prompt_salt=salt),
        encode_pair(private, prompt_salt=salt),
    ):
        sent = PairEvent.parse(hashed[1])
        assert b"secret question" not in hashed[1]
        assert sent.request.prompt is None
        assert sent.request.prompt_hash == prompt_hash("secret question", salt)
        assert hashed[0] == key  # the key is the pair's, whatever the prompt


@pytest.mark.parametrize("item", [{"route": "no pair here"}, 42, None])
def test_what_is_not_a_pair_is_refused(item: Any) -> None:
    with pytest.raises(SchemaError):
        encode_pair(item)


def test_a_degradation_event_is_keyed_by_route_and_nothing_else_encodes() -> None:
    key, value = encode_degradation(event())
    assert key == b"r/int4" and DegradationEvent.parse(value) == event()
    with pytest.raises(SchemaError):
        encode_degradation(pair())  # type: ignore[arg-type]


def test_both_publishers_are_the_one_bounded_producer_on_their_topics() -> None:
    shadow, degradations = ShadowPublisher(KAFKA, 0.5), DegradationPublisher(KAFKA)
    assert isinstance(shadow, BoundedProducer) and isinstance(degradations, BoundedProducer)
    assert shadow.topic == KAFKA.topics.pairs
    assert degradations.topic == KAFKA.topics.degradations


async def test_offers_past_the_bound_or_after_stop_are_dropped_and_counted() -> None:
    producer = DegradationPublisher(KAFKA, queue_size=2)
    assert [producer.offer(event()) for _ in range(3)] == [True, True, False]
    assert producer.stats.dropped == {"queue_full": 1} and producer.stats.dropped_queue_full == 1
    await producer.stop(0.1)  # never started: what is queued is counted unsent
    assert not producer.offer(event())
    assert producer.stats.dropped == {"queue_full": 1, "stop_timeout": 2, "stopped": 1}
    assert producer.stats.offered == 4 and producer.stats.dropped_total == 4


async def test_an_item_its_encoder_refuses_is_dropped_and_the_next_is_sent() -> None:
    def encode(item: str) -> tuple[bytes, bytes]:
        if item == "poison":
            raise OverflowError("Integer exceeds 64-bit range")
        return b"k", item.encode()

    producer: BoundedProducer[str] = BoundedProducer(KAFKA, "t", encode)
    kafka = FakeKafka()
    producer._producer = kafka  # type: ignore[assignment]  # started: no broker needed
    await producer.start()
    for item in ("poison", "good"):
        assert producer.offer(item)
    await producer.stop(2.0)
    assert kafka.sent == [("t", b"k", b"good")]
    assert producer.stats.dropped == {"invalid": 1} and producer.stats.sent == 1
