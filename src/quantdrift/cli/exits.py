"""Exit codes of every command, and the one place errors become them.

===  ==========================================================================
0    ok, or a positive verdict (go, passes, rolled back as expected)
1    a negative verdict: no-go, not verified, falls short; the command worked
2    usage or bad input: a wrong flag, a missing file, malformed settings,
     an unknown route; fix the command line or the settings
3    runtime failure: the broker or Redis cannot be reached, or a bug (which
     alone prints a traceback)
===  ==========================================================================

Commands return 0 or 1 themselves and raise for the rest; :func:`run` maps
what they raise to one line on stderr and a code, so no command carries its
own copy of this mapping.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from typing import TextIO

from quantdrift import errors

OK = 0
NEGATIVE = 1
USAGE = 2
RUNTIME = 3
INTERRUPTED = 130

_KAFKA_HINT = "is it running? set QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS or run `quantdrift stack up`"
_REDIS_HINT = "is it running? set QUANTDRIFT_REDIS__URL or run `quantdrift stack up`"


def classify(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for an expected failure; None for a bug.

    Library exceptions are checked only when their library is already loaded:
    an exception cannot come from a module nobody imported, and importing
    aiokafka or redis here would slow every command down.
    """
    text = _one_line(exc)
    if isinstance(exc, errors.BrokerError):
        return RUNTIME, text
    cause = exc.__cause__
    if cause is not None and (found := _unreachable(cause)) is not None:
        return RUNTIME, found  # a wrapped "connection refused" says best what to do
    if isinstance(exc, errors.BreakerStoreError | errors.StackError | errors.GatewayError):
        return RUNTIME, text
    if isinstance(exc, errors.QuantdriftError):
        return USAGE, text
    if (found := _unreachable(exc)) is not None:
        return RUNTIME, found
    if isinstance(exc, OSError) and exc.filename is not None:
        return USAGE, f"{exc.filename}: {exc.strerror or text}"
    return None


def _unreachable(exc: BaseException) -> str | None:
    """The line for a broker or Redis that cannot be reached; None for anything else."""
    text = _one_line(exc)
    kafka = sys.modules.get("aiokafka.errors")
    if kafka is not None and isinstance(exc, kafka.KafkaConnectionError | kafka.KafkaTimeoutError):
        return f"cannot reach the Kafka broker ({text}); {_KAFKA_HINT}"
    if kafka is not None and isinstance(exc, kafka.KafkaError):
        return f"Kafka broker: {text}"
    redis = sys.modules.get("redis.exceptions")
    if redis is not None and isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return f"cannot reach Redis ({text}); {_REDIS_HINT}"
    if isinstance(exc, ConnectionError | TimeoutError):
        return f"connection failed: {text}"
    return None


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " | ".join(lines) or type(exc).__name__


def run(
    func: Callable[[argparse.Namespace], int | None],
    args: argparse.Namespace,
    err: TextIO | None = None,
) -> int:
    """Call a command and turn what it raises into an exit code and one stderr line."""
    err = err or sys.stderr
    try:
        return int(func(args) or OK)
    except KeyboardInterrupt:
        return INTERRUPTED
    except SystemExit as exc:
        # A command that exits with a message (``raise SystemExit("...")``) was given
        # something it cannot use; Python would make that 1, which means "no-go" here.
        if isinstance(exc.code, str):
            msg = exc.code if exc.code.startswith("quantdrift") else f"quantdrift: {exc.code}"
            err.write(msg.rstrip("\n") + "\n")
            return USAGE
        return int(exc.code or OK)
    except Exception as exc:  # the one boundary where every error is mapped
        known = classify(exc)
        if known is None:
            traceback.print_exc(file=err)
            err.write(f"quantdrift: internal error: {_one_line(exc)} (a bug; please report it)\n")
            return RUNTIME
        code, line = known
        err.write(f"quantdrift: error: {line}\n")
        return code
