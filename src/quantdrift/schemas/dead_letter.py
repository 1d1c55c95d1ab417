"""DeadLetter: a message that could not be used, kept whole with its reason."""

from __future__ import annotations

import base64
import time
from typing import Literal

from quantdrift.schemas.base import SCHEMA_VERSION, Message


class DeadLetter(Message):
    """Published to ``quantdrift.dlq.v1``; ``original_b64`` holds the exact bytes."""

    schema_version: Literal[1] = SCHEMA_VERSION
    original_b64: str
    topic: str
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    error: str
    ts: float

    @classmethod
    def of(
        cls,
        raw: bytes | None,
        *,
        topic: str,
        error: str,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | str | None = None,
        now: float | None = None,
    ) -> DeadLetter:
        """Wrap raw bytes; errors are cut to 2 kB so a DLQ record stays readable."""
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        return cls(
            original_b64=base64.b64encode(raw or b"").decode("ascii"),
            topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            error=error[:2000],
            ts=time.time() if now is None else now,
        )

    def original(self) -> bytes:
        return base64.b64decode(self.original_b64)
