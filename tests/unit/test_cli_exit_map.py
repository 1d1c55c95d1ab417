"""The one mapping from what a command raises to an exit code and a stderr line."""

from __future__ import annotations

import argparse
import io

import pytest

from quantdrift.cli import exits
from quantdrift.errors import BreakerStoreError, BrokerError, ConfigError, InputError


def outcome(exc: BaseException | None, returns: int | None = None) -> tuple[int, str]:
    def command(_: argparse.Namespace) -> int | None:
        if exc is not None:
            raise exc
        return returns

    err = io.StringIO()
    code = exits.run(command, argparse.Namespace(), err=err)
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("bad setting X"), exits.USAGE),
        (InputError("unknown route 'r'"), exits.USAGE),
        (FileNotFoundError(2, "No such file or directory", "pairs.jsonl"), exits.USAGE),
        (BrokerError("cannot reach the Kafka broker at h:1"), exits.RUNTIME),
        (BreakerStoreError("redis: boom"), exits.RUNTIME),
        (ConnectionRefusedError(111, "Connection refused"), exits.RUNTIME),
        (SystemExit("quantdrift: error: --rate must be > 0"), exits.USAGE),
    ],
)
def test_expected_failures_are_one_line(exc: BaseException, code: int) -> None:
    got, err = outcome(exc)
    assert got == code
    assert err.count("\n") == 1 and err.startswith("quantdrift: error: ")
    assert "Traceback" not in err


def test_a_redis_error_under_a_quantdrift_error_names_redis() -> None:
    import redis.exceptions

    try:
        raise BreakerStoreError("redis: Error 111") from redis.exceptions.ConnectionError("E111")
    except BreakerStoreError as wrapped:
        got, err = outcome(wrapped)
    assert got == exits.RUNTIME and "cannot reach Redis (E111)" in err


def test_verdicts_pass_through_and_a_bug_is_a_traceback_and_3() -> None:
    assert outcome(None, returns=None) == (0, "")
    assert outcome(None, returns=1) == (1, "")  # a negative verdict, not a crash
    assert outcome(SystemExit(0)) == (0, "")
    assert outcome(KeyboardInterrupt()) == (130, "")
    got, err = outcome(KeyError("oops"))
    assert got == exits.RUNTIME
    assert "Traceback" in err and "internal error" in err.splitlines()[-1]
