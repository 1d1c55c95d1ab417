"""``quantdrift stack up`` / ``stack down``: the embedded broker and Redis, detached.

``stack up`` prints shell lines, so ``eval "$(quantdrift stack up)"`` points
the current shell at the stack; human-readable lines are ``#`` comments.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from quantdrift.errors import StackError
from quantdrift.stack.embedded import EmbeddedStack, default_state_path, read_state, stop_from_state
from quantdrift.stack.redis_server import DEFAULT_PROBE_URL


def _down_command(path: Path, default: Path) -> str:
    """The exact ``stack down`` that stops this stack, ``--state`` included when needed."""
    if path.resolve() == default.resolve():
        return "quantdrift stack down"
    return f"quantdrift stack down --state {shlex.quote(str(path.resolve()))}"


def _fail(command: str, exc: Exception, code: int = 3) -> int:
    """One line on stderr: the first line of the error and the last lines of any log tail.

    ``code`` is 3 (runtime failure) for a stack that would not start or stop, 2 for
    a command that cannot apply (already up, no state file): see ``cli.exits``."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1:
        lines = lines[:1] + lines[1:][-3:]
    print(
        f"quantdrift: error: stack {command}: {' | '.join(lines) or type(exc).__name__}",
        file=sys.stderr,
    )
    return code


def stack_up(args: argparse.Namespace) -> int:
    """Start the stack detached, record it, print how to reach it."""
    path: Path = args.state or default_state_path()
    if path.exists():
        try:
            previous = read_state(path)
        except StackError as exc:
            return _fail("up", StackError(f"{exc}; delete it if no stack is running"), 2)
        if previous.alive():
            return _fail(
                "up",
                StackError(
                    f"already up at {previous.bootstrap} (state {path}); "
                    f"run `{_down_command(path, default_state_path())}` first"
                ),
                2,
            )
    stack = EmbeddedStack(
        redis_url=args.redis_url,
        redis_probe_url=DEFAULT_PROBE_URL if args.adopt_redis else None,
        detached=True,
    )
    try:
        stack.start()
    except StackError as exc:
        return _fail("up", exc)
    try:
        stack.write_state(path)
    except StackError as exc:
        stack.stop()
        return _fail("up", exc)
    assert stack.broker is not None and stack.redis is not None
    redis_note = (
        f"started by us, pid {stack.redis.pid}" if stack.redis.started_by_us else "already running"
    )
    print(f"# kafka bootstrap {stack.bootstrap} (Tansu pid {stack.broker.pid})")
    print(f"# redis {stack.redis_url} ({redis_note})")
    print(f"# state {path}; stop with: {_down_command(path, default_state_path())}")
    print(f"export QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS={shlex.quote(stack.bootstrap)}")
    print(f"export QUANTDRIFT_REDIS__URL={shlex.quote(stack.redis_url)}")
    return 0


def stack_down(args: argparse.Namespace) -> int:
    """Stop the processes recorded by ``stack up``, and only those."""
    path: Path = args.state or default_state_path()
    try:
        outcomes = stop_from_state(path)
    except StackError as exc:
        return _fail("down", exc, 3 if path.exists() else 2)
    for role, outcome in outcomes.items():
        print(f"{role}: {outcome}")
    return 0
