"""The DLQ as both stages write to it: each letter sent keyed like its record, and counted."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable

import faust

from quantdrift.schemas import DeadLetter
from quantdrift.streams.delivery import Send
from quantdrift.streams.stats import WorkerStats


class DeadLetterSink:
    """Sends dead letters to the DLQ topic; ``stats.dead_letters`` counts every one."""

    def __init__(self, topic: faust.TopicT, stats: WorkerStats) -> None:
        self._topic = topic
        self._stats = stats

    async def send(self, letters: Iterable[DeadLetter]) -> None:
        for letter in letters:
            await self.sender(letter)()

    def sender(self, letter: DeadLetter) -> Send:
        """Count ``letter`` once and return what sends it (each call one attempt).

        The score stage waits for the broker's answer and resends on a refusal
        (``streams/delivery.py``); the letter is counted once however many attempts.
        """
        self._stats.dead_letters += 1
        key = (letter.key or "").encode() or None
        value = letter.dumps()

        async def send() -> Awaitable[object]:
            return await self._topic.send(key=key, value=value)

        return send
