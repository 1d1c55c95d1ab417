"""The rig's supervisor (``support/supervisor.py``): a failed worker is started again and
each restart recorded, as systemd's ``Restart=on-failure`` would; bounded by a burst;
a clean exit is left alone. Real processes, exiting with the worker's designed code."""

from __future__ import annotations

import sys
from pathlib import Path
from subprocess import Popen

from support.rig_stack import wait
from support.supervisor import Supervisor

# Exits 70 while the counter file holds fewer than ``stop_at`` lines, then stays up.
FLAKY = """
import sys, time
path, stop_at = sys.argv[1], int(sys.argv[2])
with open(path, "a+") as f:
    f.seek(0)
    n = len(f.read().splitlines())
    f.write("start\\n")
if n < stop_at:
    sys.exit(70)
time.sleep(60)
"""


def test_a_worker_that_exits_70_is_started_again_and_each_restart_recorded(
    tmp_path: Path,
) -> None:
    starts, procs = tmp_path / "starts", []

    def start() -> Popen[bytes]:
        procs.append(Popen([sys.executable, "-c", FLAKY, str(starts), "2"]))
        return procs[-1]

    sup = Supervisor(start, "the worker", delay_s=0.1)
    try:

        def third_up() -> bool:
            n = len(starts.read_text().splitlines()) if starts.exists() else 0
            return len(sup.restarts) == 2 and n == 3 and sup.proc.poll() is None

        wait(third_up, 30, "two restarts and the third start up")
        assert [r.status for r in sup.restarts] == [70, 70]
        assert all(r.started_at - r.exited_at >= 0.1 for r in sup.restarts)
        assert not sup.gave_up
        lines = sup.describe(since=sup.restarts[0].exited_at)
        assert lines[0].startswith("the worker exited 70 at +0.0s of the fault, restarted")
    finally:
        sup.stop()
        for p in procs:
            p.kill()
            p.wait(10)
    assert len(sup.restarts) == 2  # stopped: the kill above was not restarted


def test_the_supervisor_gives_up_after_its_burst_and_leaves_a_clean_exit(
    tmp_path: Path,
) -> None:
    failing = Supervisor(
        lambda: Popen([sys.executable, "-c", "raise SystemExit(70)"]),
        "failing",
        delay_s=0.05,
        burst=2,
    )
    clean = Supervisor(lambda: Popen([sys.executable, "-c", "pass"]), "clean", delay_s=0.05)
    try:
        wait(lambda: failing.gave_up and clean.clean_exit, 30, "the give-up and the clean exit")
        assert len(failing.restarts) == 2 and failing.proc.returncode == 70
        assert failing.describe(0.0)[-1] == "failing: the supervisor gave up after 2 restarts"
        assert clean.restarts == []
    finally:
        failing.stop()
        clean.stop()
