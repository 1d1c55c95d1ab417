"""Crash points for the fault tests: a process SIGKILLs itself at a named step.

The fault tests need kill -9 to land *inside* a breaker transition (after the
Lua commit, after the send but before the ack, before the commit), a window of
microseconds that a kill from outside would hit by luck only. Off unless
``worker.failpoints`` names the points (``QUANTDRIFT_WORKER__FAILPOINTS``).

Points: ``before_commit``, ``after_commit`` (store), ``after_send`` (relay),
``score:<pair_id>`` (scoring one pair, in the static lane's thread), ``send_score``
(a pair scored, before its score is sent), ``escalate`` (a batch's escalated pairs,
in the escalation lane, before the full model runs).

A name prefixed ``raise:`` raises ``InjectedFault`` there instead of killing: an
unexpected exception, for the tests that check what a failure inside an agent does.
A name prefixed ``sleep:`` blocks the calling thread for ``SLEEP_S`` seconds there: a
step made slow on purpose, for the tests that check what must not wait for it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Collection

Failpoint = Callable[[str], None]
SLEEP_S = 6.0


class InjectedFault(RuntimeError):
    """Raised at a ``raise:`` failpoint; deliberately not a QuantdriftError (unexpected)."""


def no_failpoint(name: str) -> None:
    """The production failpoint: nothing happens."""


def failpoints(names: Collection[str]) -> Failpoint:
    """A callable that kills the process at any of ``names``, saying so on stderr first."""
    armed = frozenset(names)
    if not armed:
        return no_failpoint
    raising = frozenset(n.removeprefix("raise:") for n in armed if n.startswith("raise:"))
    sleeping = frozenset(n.removeprefix("sleep:") for n in armed if n.startswith("sleep:"))

    def hit(name: str) -> None:
        if name in sleeping:
            sys.stderr.write(f"quantdrift failpoint sleep:{name}: sleeping {SLEEP_S} s\n")
            sys.stderr.flush()
            time.sleep(SLEEP_S)
            return
        if name in raising:
            sys.stderr.write(f"quantdrift failpoint raise:{name}: raising InjectedFault\n")
            sys.stderr.flush()
            raise InjectedFault(f"failpoint {name}")
        if name in armed:
            # The line is the test's proof that the crash happened at this point.
            sys.stderr.write(f"quantdrift failpoint {name}: SIGKILL pid {os.getpid()}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return hit
