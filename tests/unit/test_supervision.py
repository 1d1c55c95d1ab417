"""Supervisor: a crashing loop is logged, counted and restarted; given up on -> not ready."""

from __future__ import annotations

import asyncio
import logging

import pytest

from quantdrift.supervision import Supervisor


async def test_a_crash_is_logged_counted_and_the_loop_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sup = Supervisor(backoff_s=(0.001, 0.01))
    runs: list[int] = []
    done = asyncio.Event()

    async def loop() -> None:
        runs.append(1)
        if len(runs) <= 2:
            raise TypeError("Integer exceeds 64-bit range")
        done.set()
        await asyncio.sleep(3600)

    with caplog.at_level(logging.ERROR, "quantdrift.supervision"):
        task = sup.spawn("publisher", loop)
        await asyncio.wait_for(done.wait(), 5)
    assert sup.crashes == {"publisher": 2} and sup.ready
    crashes = [r for r in caplog.records if "task publisher crashed" in r.getMessage()]
    assert len(crashes) == 2 and all(r.exc_info for r in crashes)  # with the traceback
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sup.crashes == {"publisher": 2}  # a cancel is a stop, not a crash


async def test_a_loop_that_keeps_crashing_is_given_up_and_the_process_not_ready() -> None:
    sup = Supervisor(backoff_s=(0.001, 0.002), give_up_after=3)

    async def loop() -> None:
        raise RuntimeError("always")

    await asyncio.wait_for(sup.spawn("follower", loop), 5)
    assert sup.crashes == {"follower": 3}
    assert sup.failed == {"follower"} and not sup.ready


async def test_a_loop_that_returns_is_done() -> None:
    sup = Supervisor()
    calls: list[int] = []

    async def loop() -> None:
        calls.append(1)

    await asyncio.wait_for(sup.spawn("once", loop), 5)
    assert calls == [1] and sup.crashes == {} and sup.ready
