"""Security: forged, replayed, stale and wrong-key commands refused and counted; private prompts
never reach a topic in clear.

The Kafka-path refusals are also in tests/integration/test_controller.py; here the
attacker uses both ways into a running RouteController (the control topic and the
Redis key the breaker mirrors), against commands signed by the worker's real key.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
import redis.asyncio as aioredis

from quantdrift.demo import synthetic
from quantdrift.errors import SchemaError
from quantdrift.gateway.control.controller import RouteController, command_key
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.schemas import CommandSigner, DeadLetter, PairEvent, RouteCommand
from quantdrift.schemas.pair import RequestInfo
from quantdrift.schemas.signing import signer_from_settings, verifier_from_settings
from support.guard import on_route, send_pairs, shadow_only, until_seen
from support.kafka import consume_n

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


async def wait_until(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_forged_replayed_stale_and_wrong_key_commands_are_refused(fault_worker) -> None:  # type: ignore[no-untyped-def]
    cfg, _ = fault_worker
    kafka = cfg.kafka
    assert cfg.redis.url is not None
    route = f"sec/{uuid.uuid4().hex[:6]}"
    signer = signer_from_settings(cfg.signing.active_key_id, cfg.signing.keys)
    verifier = verifier_from_settings(cfg.signing.keys)

    def unsigned(epoch: int, action: str = "rollback", **extra: object) -> RouteCommand:
        return RouteCommand.model_validate(
            {
                "command_id": f"{route}#{epoch}",
                "route": route,
                "action": action,
                "target": "reference" if action == "rollback" else "candidate",
                "epoch": epoch,
                "issued_at": time.time(),
                **extra,
            }
        )

    def cmd(epoch: int, action: str = "rollback", **extra: object) -> bytes:
        return signer.seal(unsigned(epoch, action, **extra))

    def tampered(raw: bytes) -> bytes:
        envelope = json.loads(raw)
        payload = json.loads(envelope["payload"])
        payload["target"] = "candidate" if payload["target"] == "reference" else "reference"
        envelope["payload"] = json.dumps(payload)
        return json.dumps(envelope).encode()

    controller = RouteController(
        kafka,
        cfg.redis.url,
        verifier,
        key_prefix=cfg.redis.key_prefix,
        routes=[route],
        poll_interval_s=0.05,
    )
    applied: list[int] = []
    controller.on_change(lambda r, c: applied.append(c.epoch) if r == route else None)
    client = aioredis.Redis.from_url(cfg.redis.url)
    await controller.start()
    try:
        assert await controller.wait_kafka_ready(15)
        # The control topic is shared with the worker's other tests and replayed from its
        # start: count only what this test's commands do.
        duplicates_before = controller.stats.duplicates
        first, second = cmd(1), cmd(2, "restore")
        attacks = [
            first,  # genuine: applied
            first,  # the same bytes again: a duplicate, nothing to do
            tampered(first),  # tampered: forged
            CommandSigner(signer.key_id, b"guessed-key").seal(unsigned(7)),  # wrong key
            CommandSigner("attacker", b"k").seal(unsigned(7)),  # unknown key id
            json.dumps({**json.loads(cmd(7)), "signature": ""}).encode(),  # unsigned
            second,  # genuine: applied
            first,  # replayed after a newer one: stale
            cmd(2, "rollback", command_id="other"),  # genuinely signed, same epoch: stale
            cmd(3, "restore", issued_at=time.time() - 3600),  # an old restore: stale issued_at
        ]
        await send_pairs(
            kafka.bootstrap_servers, kafka.topics.control, [(route.encode(), a) for a in attacks]
        )
        await controller.wait_for(route, lambda c: c.epoch == 2, timeout=10)
        await wait_until(lambda: verifier.refused.get("stale_issued_at", 0) >= 1, timeout=10)
        assert controller.target(route) == "candidate" and controller.epoch(route) == 2

        # The same attacks through the Redis key the gateway polls.
        key = command_key(cfg.redis.key_prefix, route)
        await client.set(key, tampered(second))
        await wait_until(lambda: verifier.refused.get("bad_signature", 0) >= 3, timeout=10)
        await client.set(key, first)  # an old genuine command
        await wait_until(lambda: verifier.refused.get("stale_epoch", 0) >= 3, timeout=10)
        assert controller.target(route) == "candidate" and controller.epoch(route) == 2
        assert verifier.refused == {
            "stale_issued_at": 1,
            "bad_signature": 3,  # tampered and wrong key on the topic, tampered in Redis
            "unknown_key": 1,
            "unsigned": 1,
            "stale_epoch": 3,  # replay and same-epoch on the topic, replay in Redis
        }
        # Per route: the shared worker's other routes may have real commands under the prefix.
        assert applied == [1, 2]
        assert controller.stats.duplicates - duplicates_before == 1
    finally:
        await controller.stop()
        await client.delete(command_key(cfg.redis.key_prefix, route))
        await client.aclose()


def route_of(value: bytes | None) -> str | None:
    """The route of a pairs-topic record; None for the poison other tests leave there."""
    try:
        return PairEvent.parse(value or b"").route
    except SchemaError:
        return None


async def test_private_prompts_never_reach_a_topic_in_clear(fault_worker) -> None:  # type: ignore[no-untyped-def]
    cfg, worker = fault_worker
    kafka = cfg.kafka
    route = "sec/private"
    base = on_route(shadow_only(synthetic.healthy(route, seed=71), 12), route, "priv")
    secrets = [f"SECRET-{uuid.uuid4().hex}-{i}" for i in range(len(base))]
    plain = ShadowPublisher(kafka, 1.0)
    hashing = ShadowPublisher(kafka, 1.0, hash_prompts=True)
    for publisher in (plain, hashing):
        await publisher.start()
    for i, (pair, secret) in enumerate(zip(base, secrets, strict=True)):
        if i % 3 == 0:  # a gateway that marks the request private, as a dict
            data = pair.model_dump(mode="json", exclude_none=True)
            data["request"] = {**data["request"], "prompt": secret, "private": True}
            assert plain.offer(data)
        elif i % 3 == 1:  # a model built without validation (the schema refuses it)
            request = RequestInfo.model_construct(
                **{**pair.request.model_dump(), "prompt": secret, "private": True}
            )
            assert plain.offer(pair.model_copy(update={"request": request}))
        else:  # not private, but the gateway hashes every prompt
            request = pair.request.model_copy(update={"prompt": secret})
            assert hashing.offer(pair.model_copy(update={"request": request}))
    for publisher in (plain, hashing):
        await publisher.stop(timeout=15)
        assert publisher.stats.dropped == {}, publisher.stats
    await until_seen(cfg, route, len(base), worker, timeout=60)

    leaks = []
    for topic in kafka.topics.model_dump().values():
        records = await consume_n(
            kafka.bootstrap_servers, topic, 1_000_000, timeout=2.0, strict=False
        )
        for r in records:
            blobs = [r.key or b"", r.value or b""]
            if topic == kafka.topics.dlq and r.value:
                blobs.append(DeadLetter.parse(r.value).original())
            for secret in secrets:
                if any(secret.encode() in blob for blob in blobs):
                    leaks.append((topic, secret))
    assert not leaks, f"private prompts in clear: {leaks[:5]}"
    pairs_topic = await consume_n(
        kafka.bootstrap_servers,
        kafka.topics.pairs,
        len(base),
        timeout=10,
        # Pairs are keyed by pair_id (any worker scores them): find this route's by content.
        predicate=lambda r: route_of(r.value) == route,
    )
    assert all(b'"prompt_hash"' in r.value for r in pairs_topic)
