"""Forgetting a test's Redis keys: every test keeps its keys under a prefix of its own."""

from __future__ import annotations

import redis


def forget_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (in batches, so a large run stays cheap)."""
    client = redis.Redis.from_url(redis_url)
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
