"""SIGTERM stops a worker within Docker's default 10 s grace, broker or not.

Real ``quantdrift worker`` processes against a Tansu broker this test owns, so it
can kill the broker without touching the suite's. Before the stop deadline a worker
whose broker was gone took 61 s to exit (aiokafka kept retrying its commit, its
group leave and its producer flush), and Docker SIGKILLed it at 10 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from types import SimpleNamespace

import pytest

from quantdrift.demo.workers import WorkerProcess
from quantdrift.stack import TansuBroker, kafka_metadata_ok
from support.guard import isolated_settings, make_topics, wait_scored
from support.workers import start_worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

GRACE_S = 10.0  # Docker's default stop grace, and compose's stop_grace_period


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0): read its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def sigterm_and_time(worker: WorkerProcess) -> float:
    assert worker.proc is not None and worker.alive(), worker.log_tail()
    started = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(timeout=GRACE_S * 3)
    except subprocess.TimeoutExpired:
        worker.proc.kill()
        worker.proc.wait(timeout=5)
        raise AssertionError(f"worker still running {GRACE_S * 3:g} s after SIGTERM") from None
    return time.monotonic() - started


@pytest.mark.parametrize("broker_gone", [True, False], ids=["broker-killed", "broker-up"])
async def test_sigterm_stops_the_worker_within_the_grace_period(
    fault_stack,  # type: ignore[no-untyped-def]
    broker_gone: bool,
) -> None:
    broker = TansuBroker().start()
    host, port = broker.bootstrap.rsplit(":", 1)
    settings = isolated_settings(
        SimpleNamespace(bootstrap=broker.bootstrap, redis_url=fault_stack.redis_url),
        f"qdfault:{uuid.uuid4().hex}:",
        partitions=2,
    )
    await make_topics(settings)
    worker = start_worker(settings, fault_stack.redis_url)
    try:
        await wait_scored(settings, worker)  # in its group, with a partition to commit
        if broker_gone:
            pid = broker.pid
            assert pid is not None
            broker.stop()
            # The fault is real: the broker process is gone and its port answers nothing.
            assert process_gone(pid)
            assert not kafka_metadata_ok(host, int(port), timeout=0.5)
            assert worker.alive(), worker.log_tail()
        elapsed = sigterm_and_time(worker)
        if broker_gone:
            assert not kafka_metadata_ok(host, int(port), timeout=0.5)  # still gone throughout
        print(f"worker exited {elapsed:.2f} s after SIGTERM (broker gone: {broker_gone})")
        assert elapsed < GRACE_S, f"{elapsed:.1f} s after SIGTERM\n{worker.log_tail()}"
        assert worker.proc is not None and worker.proc.returncode == 0, worker.log_tail()
    finally:
        worker.stop()
        broker.stop()
