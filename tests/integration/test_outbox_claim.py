"""The outbox is published by one worker at a time: a claim in Redis, released or expired."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.signing import CommandSigner


async def test_one_claim_at_a_time_then_ack_release_or_expiry(stack, redis_prefix) -> None:  # type: ignore[no-untyped-def]
    client = aioredis.Redis.from_url(stack.redis_url)
    store = RedisBreakerStore(client, CommandSigner("k", b"secret"), key_prefix=redis_prefix)
    try:
        await store.manual("r/int4", "rollback", RoutePolicy(), now=1.0)
        first = await store.claim("r/int4", "worker-a", ttl_ms=300)
        assert first is not None and [i.topic for i in first.items] == ["control", "alerts"]
        assert await store.claim("r/int4", "worker-b") is None  # a holds it
        b_attempt = first.__class__("r/int4", "worker-b:forged", first.items)
        await store.release(b_attempt)  # not b's to release: a keeps it
        assert await store.claim("r/int4", "worker-b") is None
        # a died mid-flush: wait for its claim to expire (a condition, bounded), then b takes over.
        owner_key = route_key(redis_prefix, "r/int4", "outbox:owner")
        async with asyncio.timeout(5):
            while await client.exists(owner_key):
                await asyncio.sleep(0.02)
        second = await store.claim("r/int4", "worker-b")
        assert second is not None
        assert [i.value for i in second.items] == [i.value for i in first.items]
        assert await store.ack(first) is False  # a's late ack is fenced: nothing trimmed
        assert await client.llen(route_key(redis_prefix, "r/int4", "outbox")) == 2
        assert await store.ack(second) is True
        assert await store.claim("r/int4", "worker-a") is None  # nothing left
        assert await client.exists(owner_key) == 0
    finally:
        await client.aclose()
