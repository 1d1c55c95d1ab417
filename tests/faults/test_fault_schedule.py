"""The short fault schedule under load, on the multi-host rig, audited by the checker.

Each case (``support/fault_cases.py`` states what it expects) runs on a fresh rig:
the openai SDK drives the real gateway, every request mirrored, the real worker
judging; the fault goes on for ``HOLD_S``, is proven in its window (a drop rule's
counter, the proxy's held chunks, a SIGKILL's exit status and failpoint line, no
pair judged while a worker is cut off), healed, and the run ends with an operator's
lock. The oracle is ``support/fault_oracle.check``, written apart from the code it
checks: every mirrored request judged once, dead-lettered or dropped with a reason;
no double transition; the newest command applied; no user 5xx; no candidate after
the lock. The cases here:

* worker <-> Redis cut: the worker stops judging; healed, every pair judged once,
  one decision;
* a second worker SIGKILLed while it holds a scored batch: redelivery, each pair
  judged once, exactly one transition;
* 5 % loss between worker and broker: judging goes on, nothing lost or doubled;
* 300 ms on each round trip between worker and Redis: judging slows, nothing lost.

``make bench-faults`` runs all fourteen cases for minutes each (``bench/faults.py``).
"""

from __future__ import annotations

import pytest

from support.fault_cases import BY_NAME, SHORT
from support.fault_run import run_case

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.timeout(420),
]

HOLD_S = 20.0
SEED = 41


@pytest.mark.parametrize("name", SHORT)
def test_fault_case_leaves_every_pair_and_command_accounted_for(name: str) -> None:
    row = run_case(BY_NAME[name], HOLD_S, SEED)
    print(
        f"\n{row.case}: {row.seconds}s; recover {row.recover_s}s; {row.accounted}\n  "
        + "\n  ".join(row.observed)
    )
    assert not row.violations, "\n".join(row.violations)
