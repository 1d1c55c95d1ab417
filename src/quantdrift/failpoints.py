"""Crash points for the fault tests: a process SIGKILLs itself at a named step.

The fault tests need kill -9 to land *inside* a breaker transition (after the
Lua commit, after the send but before the ack, before the commit), a window of
microseconds that a kill from outside would hit by luck only. Off unless
``worker.failpoints`` names the points (``QUANTDRIFT_WORKER__FAILPOINTS``).

Points: ``before_commit``, ``after_commit`` (store), ``after_send`` (relay).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Collection

Failpoint = Callable[[str], None]


def no_failpoint(name: str) -> None:
    """The production failpoint: nothing happens."""


def failpoints(names: Collection[str]) -> Failpoint:
    """A callable that kills the process at any of ``names``, saying so on stderr first."""
    armed = frozenset(names)
    if not armed:
        return no_failpoint

    def hit(name: str) -> None:
        if name in armed:
            # The line is the test's proof that the crash happened at this point.
            sys.stderr.write(f"quantdrift failpoint {name}: SIGKILL pid {os.getpid()}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return hit
