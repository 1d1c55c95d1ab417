"""A worker started while its broker is away waits for it (``streams/broker_wait.py``).

Found by the fault rig's worker-broker case: a worker the supervisor restarted during
the cut exited 1 every ~25 s (Faust gives up on bootstrap after one request timeout),
a crash loop that a service manager's back-off would stretch past the healing. Now
the real ``quantdrift worker`` tries again for ``worker.stall_after_s``: a broker that
comes up within it is joined and judged on; one that does not ends in exit 69 with
one line naming it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import pytest

from quantdrift.demo.workers import WorkerProcess
from quantdrift.stack import EmbeddedStack, free_port
from support.delay_proxy import DelayProxy
from support.guard import isolated_settings, make_topics, wait_scored

pytestmark = [pytest.mark.timeout(240)]


def test_a_worker_whose_broker_comes_up_late_waits_and_judges(
    fault_stack: EmbeddedStack,
) -> None:
    settings = isolated_settings(fault_stack, f"qdwait:{uuid.uuid4().hex}:")
    asyncio.run(make_topics(settings))
    host, port = fault_stack.bootstrap.rsplit(":", 1)
    door = DelayProxy("127.0.0.1", host, int(port))  # not listening yet: the broker is away
    late = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"bootstrap_servers": door.address}),
            "worker": settings.worker.model_copy(update={"stall_after_s": 60.0}),
        }
    )
    worker = WorkerProcess(late, fault_stack.redis_url, log_level="warning").start()
    try:
        deadline = time.monotonic() + 60
        while "unreachable at startup (try 2)" not in worker.log_path.read_text():
            assert worker.proc is not None and worker.proc.poll() is None, "the worker exited"
            assert time.monotonic() < deadline, worker.log_path.read_text()[-2000:]
            time.sleep(0.2)
        door.start()
        asyncio.run(wait_scored(late, worker))
        assert "reached after" in worker.log_path.read_text()
        assert worker.proc is not None and worker.proc.poll() is None
    finally:
        worker.stop()
        door.stop()


def test_a_worker_whose_broker_stays_away_exits_69_and_says_why(
    fault_stack: EmbeddedStack,
) -> None:
    env = {
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "QUANTDRIFT_WORKER__STALL_AFTER_S": "4",
        "QUANTDRIFT_REDIS__URL": fault_stack.redis_url,
        "QUANTDRIFT_EMBEDDING__TIER": "none",
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "quantdrift", "worker", "--log-level", "warning"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 69, done.stderr[-2000:]
    assert time.monotonic() - started >= 4
    assert "unreachable for 4 s" in done.stderr and "exiting (code 69)" in done.stderr
