"""The DLQ as both stages write to it: each letter sent keyed like its record, and counted."""

from __future__ import annotations

from collections.abc import Iterable

import faust

from quantdrift.schemas import DeadLetter
from quantdrift.streams.stats import WorkerStats


class DeadLetterSink:
    """Sends dead letters to the DLQ topic; ``stats.dead_letters`` counts every one."""

    def __init__(self, topic: faust.TopicT, stats: WorkerStats) -> None:
        self._topic = topic
        self._stats = stats

    async def send(self, letters: Iterable[DeadLetter]) -> None:
        for letter in letters:
            self._stats.dead_letters += 1
            key = (letter.key or "").encode() or None
            await self._topic.send(key=key, value=letter.dumps())
