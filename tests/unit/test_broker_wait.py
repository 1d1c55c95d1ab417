"""streams/broker_wait.py: a starting worker tries its broker again, with a growing
pause, until it answers or the bound has passed (then one BrokerError naming it)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import pytest

from quantdrift.config import KafkaSettings
from quantdrift.errors import BrokerError
from quantdrift.streams.broker_wait import wait_for_broker


def flaky(fail_times: int) -> tuple[list[float], Callable[[KafkaSettings], Awaitable[None]]]:
    calls: list[float] = []

    async def attempt(_: KafkaSettings) -> None:
        calls.append(time.monotonic())
        if len(calls) <= fail_times:
            raise BrokerError("cannot reach the Kafka broker")

    return calls, attempt


def test_a_broker_that_comes_back_is_waited_for() -> None:
    calls, attempt = flaky(3)
    kafka = KafkaSettings(bootstrap_servers="broker:9092")
    tries = asyncio.run(
        wait_for_broker(kafka, 10, attempt=attempt, first_pause_s=0.01, max_pause_s=0.04)
    )
    assert tries == 4 == len(calls)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.01 and gaps[1] >= 0.02 and gaps[2] >= 0.04  # doubling, capped


def test_a_broker_away_past_the_bound_is_one_clear_error() -> None:
    calls, attempt = flaky(10_000)
    kafka = KafkaSettings(bootstrap_servers="broker:9092")
    start = time.monotonic()
    with pytest.raises(BrokerError, match=r"the broker at broker:9092 unreachable for \d+ s"):
        asyncio.run(wait_for_broker(kafka, 0.3, attempt=attempt, first_pause_s=0.02))
    assert 0.3 <= time.monotonic() - start < 2.0 and len(calls) >= 3
