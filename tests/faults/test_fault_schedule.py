"""The fault schedule under load, on the multi-host rig, audited by the checker.

Each case (``support/fault_cases.py`` states what it expects) runs on a fresh rig:
the openai SDK drives the real gateway, every request mirrored, the real worker
judging; the fault goes on for the hold, is proven in its window (a drop rule's
counter, the proxy's held chunks, a SIGKILL's exit status and failpoint line, no
pair judged while a worker is cut off), healed, and the run ends with an operator's
lock. The oracle is ``support/fault_oracle.check``, written apart from the code it
checks: every mirrored request judged once, dead-lettered or dropped with a reason;
no double transition; the newest command applied; no user 5xx; no candidate after
the lock.

``make test`` runs the short schedule (``SHORT``, 20 s per fault):

* worker <-> Redis cut: the worker stops judging; healed, every pair judged once,
  one decision;
* a second worker SIGKILLed while it holds a scored batch: redelivery, each pair
  judged once, exactly one transition;
* 5 % loss between worker and broker: judging goes on, nothing lost or doubled;
* Redis SIGKILLed and back empty while the route is rolled back: the worker rebuilds
  the route from the control topic (it carries the rollback's epoch; past the
  cool-down, held in the long schedule, it half-opens with a newer one).

``make bench-faults`` runs every case (``--fault-schedule long``), in an order drawn
from ``--fault-seed``, each fault held ``--fault-hold`` seconds (120 by default), and
writes the fault table (``bench/fault_table.py``).
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from support.fault_cases import BY_NAME, CASES, SHORT
from support.fault_run import run_case

SHORT_HOLD_S = 20.0
LONG_HOLD_S = 120.0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The short schedule's cases, or every case in the seed's order (long)."""
    if "name" not in metafunc.fixturenames:
        return
    config = metafunc.config
    names = list(SHORT)
    if config.getoption("--fault-schedule") == "long":
        names = [c.name for c in CASES]
        random.Random(config.getoption("--fault-seed")).shuffle(names)
    # Bounded: each case's own waits are bounded; this is the backstop over them all.
    limit = pytest.mark.timeout(int(hold_of(config)) + 420)
    metafunc.parametrize("name", [pytest.param(n, marks=limit) for n in names])


def hold_of(config: pytest.Config) -> float:
    long = config.getoption("--fault-schedule") == "long"
    return float(config.getoption("--fault-hold") or (LONG_HOLD_S if long else SHORT_HOLD_S))


def test_fault_case_leaves_every_pair_and_command_accounted_for(
    name: str, request: pytest.FixtureRequest
) -> None:
    config = request.config
    hold = hold_of(config)
    nice = config.getoption("--fault-worker-nice")
    row = run_case(BY_NAME[name], hold, config.getoption("--fault-seed"), worker_nice=nice)
    print(
        f"\n{row.case}: {row.seconds}s; recover {row.recover_s}s; {row.accounted}\n  "
        + "\n  ".join(row.observed)
    )
    rows = config.getoption("--fault-rows")
    if rows:
        with open(rows, "a") as out:
            out.write(json.dumps({**dataclasses.asdict(row), "hold_s": hold}) + "\n")
    assert not row.violations, "\n".join(row.violations)
