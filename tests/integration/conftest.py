"""Session fixtures for integration tests: one real embedded stack, per-test Redis prefixes."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

from quantdrift.stack import EmbeddedStack

# rootdir-style imports: works whether or not tests/ and tests/integration/ are packages.
try:
    from kafka_helpers import consume_n
except ImportError:
    from tests.integration.kafka_helpers import consume_n


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    """Tansu on a free port plus a Redis (the machine's, or one we start), once per session."""
    with EmbeddedStack() as started:
        yield started


@pytest.fixture
def redis_prefix(stack: EmbeddedStack) -> Iterator[str]:
    """A key prefix only this test uses; every key under it is deleted afterwards."""
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    yield prefix
    client = redis.Redis.from_url(stack.redis_url)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    finally:
        client.close()


@pytest.fixture
def kafka_consume(
    stack: EmbeddedStack,
) -> Callable[..., Awaitable[list[Any]]]:
    """``await kafka_consume(topic, n, timeout=10.0)`` against the session broker."""

    async def _consume(topic: str, n: int, **kwargs: Any) -> list[Any]:
        return await consume_n(stack.bootstrap, topic, n, **kwargs)

    return _consume
