"""A score the broker does not take: sent again until it does, or the worker exits unacked.

The real parts: the embedded broker, Redis and a ``quantdrift worker`` process. The
fault: the broker is frozen (SIGSTOP) while the worker is about to hand a pair's score
to the producer, so that send times out (``kafka.request_timeout_ms`` 1.5 s here), as
the fault rig saw in a worker<->broker cut. The ``sleep:send_score`` failpoint holds
the worker at that step for 6 s, the window in which the test freezes the broker.

Before the fix the score was logged (``_on_published error``) and its pair acknowledged:
neither judged nor dead-lettered. Now either the resend lands once the broker is back
(a short freeze), or, frozen past ``worker.stall_after_s``, the worker exits with code 70
with the pair unacknowledged, and the next worker reads it again and judges it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from quantdrift.demo import synthetic
from quantdrift.schemas.record_keys import pair_record_key
from quantdrift.stack import EmbeddedStack
from quantdrift.streams.exits import EX_SOFTWARE
from support import guard
from support.transitions import FailpointWorker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

ROUTE = "send/int4"


@pytest.fixture
def own_stack() -> Iterator[EmbeddedStack]:
    """A broker of this test's own: freezing the suite's shared one would stall its workers."""
    with EmbeddedStack(redis_probe_url=None) as started:
        yield started


async def _until(predicate, timeout: float, what: str, worker: FailpointWorker) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{worker.log_tail()}"
        await asyncio.sleep(0.05)


async def _judged(stack: EmbeddedStack, prefix: str) -> int:
    return (await guard.route_state(stack.redis_url, prefix, ROUTE)).pairs_seen


@pytest.mark.parametrize("frozen_past_bound", [False, True], ids=["resent", "exit-70"])
async def test_a_score_send_that_times_out_is_resent_or_the_worker_exits_unacked(
    own_stack: EmbeddedStack, frozen_past_bound: bool
) -> None:
    stack = own_stack
    assert stack.broker is not None and stack.broker.pid is not None
    broker_pid = stack.broker.pid
    prefix = f"qdfault:{uuid.uuid4().hex}:"
    settings = guard.isolated_settings(stack, prefix, partitions=1)
    await guard.make_topics(settings)
    # stall_after_s is the give-up bound: 30 s outlasts the freeze, 4 s does not.
    bound_s = 4.0 if frozen_past_bound else 30.0
    env = {
        "QUANTDRIFT_KAFKA__REQUEST_TIMEOUT_MS": "1500",
        "QUANTDRIFT_WORKER__STALL_AFTER_S": str(bound_s),
    }
    worker = FailpointWorker(
        settings, stack.redis_url, failpoints=("sleep:send_score",), extra_env=env
    ).start()
    second: FailpointWorker | None = None
    frozen = False
    pair = guard.on_route(guard.shadow_only(synthetic.healthy(ROUTE, seed=3), 1), ROUTE, "send")[0]
    try:
        await guard.send_pairs(
            settings.kafka.bootstrap_servers,
            settings.kafka.topics.pairs,
            [(pair_record_key(pair), pair.dumps())],
        )
        # The worker is inside the failpoint: its score is about to be handed on.
        await _until(lambda: "sleep:send_score" in worker.stderr(), 90, "the failpoint", worker)
        os.kill(broker_pid, signal.SIGSTOP)
        frozen = True
        if frozen_past_bound:
            code = await asyncio.to_thread(worker.wait_exit, 60)
            assert code == EX_SOFTWARE, worker.log_tail()
            log = worker.log_tail(20_000)
            assert f"score for pair {pair.pair_id}: not delivered after 4 s" in log, log
            os.kill(broker_pid, signal.SIGCONT)
            frozen = False
            assert await _judged(stack, prefix) == 0  # the fault happened before any judging
            second = FailpointWorker(settings, stack.redis_url).start()
            deadline = time.monotonic() + 90
            while await _judged(stack, prefix) < 1:
                assert second.alive() and time.monotonic() < deadline, second.log_tail()
                await asyncio.sleep(0.1)
        else:
            # The stream library's own word that the broker's answer was a failure.
            refused = f"_on_published error for message topic {settings.kafka.topics.scores}"
            await _until(lambda: refused in worker.stderr(), 60, "the failed send", worker)
            assert await _judged(stack, prefix) == 0
            os.kill(broker_pid, signal.SIGCONT)
            frozen = False
            deadline = time.monotonic() + 60
            while await _judged(stack, prefix) < 1:
                assert worker.alive() and time.monotonic() < deadline, worker.log_tail()
                await asyncio.sleep(0.1)
            log = worker.stderr()
            assert f"score for pair {pair.pair_id}: send failed" in log, log
            assert f"score for pair {pair.pair_id}: delivered at attempt" in log, log
            # Redis kept everything: a fresh worker cut before its first read of the
            # control topic does not know that, and must not call it a loss either.
            assert "breaker state lost" not in log, log
        await asyncio.sleep(1.5)  # a redelivered duplicate would be folded by now
        assert await _judged(stack, prefix) == 1
    finally:
        if frozen:
            os.kill(broker_pid, signal.SIGCONT)
        worker.kill()
        if second is not None:
            second.kill()
