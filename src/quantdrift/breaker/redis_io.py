"""What the breaker's Redis modules share: failures in the breaker's vocabulary, and
the versioned hash every route state and noise floor is kept in.

A state or floor lives in one hash with two fields, ``v`` (its version, which the
Lua steps compare-and-set on) and ``s`` (its JSON). The store, the routes registry
and the outbox claim all wrap a Redis failure the same way, so the worker's handlers
see one exception (``BreakerStoreError``) whichever of them failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from redis.exceptions import RedisError

from quantdrift.errors import BreakerStoreError


@contextmanager
def redis_errors() -> Iterator[None]:
    """Raise a Redis failure inside the block as ``BreakerStoreError``."""
    try:
        yield
    except RedisError as exc:
        raise BreakerStoreError(f"redis: {exc}") from exc


def decode_hash(raw: list[Any], build: Callable[[Any], Any]) -> tuple[Any, int]:
    """(value, version) from an HMGET of fields v and s; a missing hash is version 0.

    >>> decode_hash([b"3", b'{"n": 1}'], lambda d: d)
    ({'n': 1}, 3)
    >>> decode_hash([None, None], lambda d: d)
    (None, 0)
    """
    version = int(raw[0]) if raw[0] else 0
    return build(orjson.loads(raw[1]) if raw[1] else None), version


def status_text(status: bytes | str) -> str:
    """A Lua step's status (``ok``, ``conflict``) as text, whatever the client decodes."""
    return status.decode() if isinstance(status, bytes) else status
