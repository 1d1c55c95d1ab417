"""ShadowPublisher against the real broker: delivery, privacy, and a dead broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
import pytest

from quantdrift.config import KafkaSettings
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.schemas import ModelOutput, PairEvent, RequestInfo
from quantdrift.schemas.privacy import prompt_hash
from quantdrift.stack import EmbeddedStack, create_topics, free_port
from support.kafka import consume_n, unique_topic

pytestmark = [pytest.mark.timeout(60)]


def pair(i: int, route: str = "cs-agent/int4", **request: object) -> PairEvent:
    return PairEvent(
        pair_id=f"p-{i}",
        ts=1_700_000_000.0 + i,
        route=route,
        candidate=ModelOutput(text=f"candidate {i}", precision="int4"),
        reference=ModelOutput(text=f"reference {i}", precision="bf16"),
        request=RequestInfo.model_validate(request),
    )


async def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    """Bounded wait on a counter the publisher updates from its own task."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_pairs_arrive_on_the_topic_keyed_by_pair_id(stack: EmbeddedStack) -> None:
    """Keyed by pair id, so one route spreads over every partition (and every scorer)."""
    topic = unique_topic("pairs")
    await create_topics(stack.bootstrap, [topic], partitions=2)
    publisher = ShadowPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=topic)
    pairs = [pair(i, route=("a/int4", "b/fp8")[i % 2]) for i in range(30)]
    # Offered before start: queued, then sent once the producer is up.
    assert all(publisher.offer(p) for p in pairs[:10])
    await publisher.start()
    assert all(publisher.offer(p) for p in pairs[10:])
    await publisher.stop(timeout=10.0)  # flushes the queue

    assert publisher.stats.sent == 30
    assert publisher.stats.dropped == {} and publisher.stats.failed == 0
    records = await consume_n(stack.bootstrap, topic, 30, timeout=10.0)
    assert sorted((r.key, r.value) for r in records) == sorted(
        (p.pair_id.encode(), p.dumps()) for p in pairs
    )
    route_a = {r.partition for r in records if PairEvent.parse(r.value).route == "a/int4"}
    assert route_a == {0, 1}, "one route's pairs should land on both partitions"


async def test_prompts_are_hashed_where_they_must_not_travel(stack: EmbeddedStack) -> None:
    topic = unique_topic("pairs-private")
    await create_topics(stack.bootstrap, [topic], partitions=1)
    kafka = KafkaSettings(bootstrap_servers=stack.bootstrap)
    salt = "publisher-test-salt-5f0c"
    plain = ShadowPublisher(kafka, 1.0, topic=topic, prompt_salt=salt)
    hashing = ShadowPublisher(kafka, 1.0, topic=topic, hash_prompts=True, prompt_salt=salt)
    private_dict = pair(1).model_dump(mode="json")
    private_dict["request"] = {"prompt": "my card is 4111", "private": True}
    # The schema refuses a private pair with a prompt; a copy that skipped validation
    # (or a dict) must still go out without it.
    private_model = pair(2).model_copy(
        update={"request": RequestInfo.model_construct(prompt="ssn 078-05-1120", private=True)}
    )
    for publisher in (plain, hashing):
        await publisher.start()
    assert plain.offer(private_dict)
    assert plain.offer(private_model)
    assert plain.offer(pair(3, prompt="public question"))
    assert hashing.offer(pair(4, prompt="hash me"))
    assert plain.offer({"route": "no pair here"})  # accepted, then dropped as invalid
    for publisher in (plain, hashing):
        await publisher.stop(timeout=10.0)

    assert plain.stats.dropped == {"invalid": 1}
    records = await consume_n(stack.bootstrap, topic, 4, timeout=10.0)
    bodies = [orjson.loads(r.value) for r in records]
    requests = {body["pair_id"]: body["request"] for body in bodies}
    assert "prompt" not in requests["p-1"] and requests["p-1"]["private"] is True
    assert requests["p-1"]["prompt_hash"] == prompt_hash("my card is 4111", salt)
    assert "prompt" not in requests["p-2"]
    assert requests["p-2"]["prompt_hash"] == prompt_hash("ssn 078-05-1120", salt)
    assert requests["p-3"]["prompt"] == "public question"
    assert "prompt" not in requests["p-4"]
    assert requests["p-4"]["prompt_hash"] == prompt_hash("hash me", salt)


async def test_offer_never_blocks_when_the_broker_is_down() -> None:
    dead = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1000)
    publisher = ShadowPublisher(dead, 1.0, queue_size=50, topic="quantdrift.pairs.v1")
    await publisher.start()
    results, slowest = [], 0.0
    for i in range(500):
        t0 = time.perf_counter()
        results.append(publisher.offer(pair(i)))
        slowest = max(slowest, time.perf_counter() - t0)
        if i % 50 == 0:
            await asyncio.sleep(0)  # let the drain task run between bursts
    assert slowest < 0.01
    assert results.count(True) == 50
    assert publisher.stats.dropped_queue_full == 450
    assert publisher.stats.dropped == {"queue_full": 450}
    # The drain task keeps retrying with backoff (0.1 s, 0.2 s, ...), offer stays instant.
    await wait_until(lambda: publisher.stats.connect_failures >= 3, timeout=5.0)
    assert not publisher.connected

    t0 = time.monotonic()
    await publisher.stop(timeout=0.5)
    assert time.monotonic() - t0 < 2.0
    assert publisher.offer(pair(999)) is False
    stats = publisher.stats
    assert stats.dropped == {"queue_full": 450, "stop_timeout": 50, "stopped": 1}
    assert stats.offered == 501 and stats.sent == 0


async def test_sampling_is_deterministic_per_request_id() -> None:
    publisher = ShadowPublisher(KafkaSettings(), 0.25)
    decisions = [publisher.should_mirror(f"req-{i}") for i in range(4_000)]
    assert decisions == [publisher.should_mirror(f"req-{i}") for i in range(4_000)]
    assert 0.2 < sum(decisions) / len(decisions) < 0.3


async def test_a_pair_orjson_cannot_encode_is_dropped_and_the_next_one_is_sent(
    stack: EmbeddedStack,
) -> None:
    """An integer past 64 bits in a user's json_schema made orjson raise TypeError inside
    the drain loop, which died silently; now that pair alone is dropped (invalid)."""
    topic = unique_topic("pairs-poison")
    await create_topics(stack.bootstrap, [topic], partitions=1)
    publisher = ShadowPublisher(KafkaSettings(bootstrap_servers=stack.bootstrap), 1.0, topic=topic)
    poisoned = pair(1).model_copy(
        update={"request": RequestInfo(expects_json=True, json_schema={"maximum": 2**64})}
    )
    with pytest.raises(TypeError):
        poisoned.dumps()  # the poison is real
    await publisher.start()
    assert publisher.offer(poisoned)
    for i in range(2, 6):
        assert publisher.offer(pair(i))
    await publisher.stop(timeout=10.0)
    assert publisher.stats.dropped == {"invalid": 1}
    assert publisher.stats.sent == 4
    assert publisher.supervisor.crashes == {}
    records = await consume_n(stack.bootstrap, topic, 4, timeout=10.0)
    assert [orjson.loads(r.value)["pair_id"] for r in records] == [f"p-{i}" for i in range(2, 6)]
