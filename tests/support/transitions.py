"""Helpers for the tests that crash, fence or wipe the breaker *inside* a transition.

* ``FailpointWorker``: a ``quantdrift worker`` child with crash points armed
  (``QUANTDRIFT_WORKER__FAILPOINTS``) and no embedder: the synthetic pairs fail
  or pass on ROUGE-L and anomalies alone, and a restart costs an import and a
  group join instead of a model load.
* ``fast_policy``: the consecutive rule with small counts and a short cool-down,
  so a test walks a route through many transitions in seconds.
* ``Follower``: a RouteController set up as ``quantdrift gateway`` sets it up
  (topic + Redis backstop, targets mapped onto pools ``int4`` / ``bf16``), with
  a log of every command it applied.
* Readers for the route's state, outbox, claim and redelivery counter in Redis,
  and for the signed commands that reached the control topic.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import yaml
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from quantdrift.breaker.state import RouteState
from quantdrift.config import Settings
from quantdrift.demo import synthetic
from quantdrift.demo.workers import WorkerProcess, settings_env
from quantdrift.gateway.control.controller import RouteController
from quantdrift.gateway.control.targets import resolver_for
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.schemas import PairEvent, RouteCommand
from quantdrift.schemas.keys import route_key
from quantdrift.schemas.record_keys import pair_record_key
from quantdrift.schemas.signing import CommandVerifier, verifier_from_settings
from quantdrift.stack import default_server_bin, free_port, redis_ping
from quantdrift.stack.ports import stop_popen
from support.guard import isolated_settings, on_route, records_for, shadow_only

Record = tuple[bytes | None, bytes | None]

# Three failing pairs in a row open the route (from the third pair on), a 1 s
# cool-down half-opens it, two passing probes close it again: three transitions
# (rollback, canary, restore) per cycle, each with its own epoch.
FAST_POLICY: dict[str, Any] = {
    "rules": ["consecutive"],
    "consecutive_failures": 3,
    "min_pairs": 3,
    "cooldown_s": 1.0,
    "cooldown_backoff": 1.0,
    "half_open_pairs": 2,
}


def fast_policy(directory: Path, **overrides: Any) -> Path:
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump({"default": {**FAST_POLICY, **overrides}}))
    return path


def transition_settings(stack: Any, prefix: str, policy: Path, partitions: int = 2) -> Settings:
    """``isolated_settings`` plus a policy file (``stack``: anything with bootstrap, redis_url)."""
    return isolated_settings(stack, prefix, partitions).model_copy(update={"policy_file": policy})


@dataclass
class FailpointWorker(WorkerProcess):
    """A worker that SIGKILLs itself at the named failpoints (none: an ordinary worker)."""

    failpoints: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self) -> FailpointWorker:
        env = {
            **os.environ,
            **settings_env(self.settings, self.redis_url),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "QUANTDRIFT_EMBEDDING__TIER": "none",
            "QUANTDRIFT_WORKER__FAILPOINTS": json.dumps(list(self.failpoints)),
            **self.extra_env,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "quantdrift", "worker", "--log-level", "warning"],
            stdout=self.log_path.open("ab"),
            stderr=self.stderr_path.open("ab"),
            env=env,
            start_new_session=True,
        )
        return self

    @property
    def stderr_path(self) -> Path:
        """stderr on its own: the failpoint line must be found where it is written."""
        return self.log_path.with_suffix(".stderr")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_tail(self, max_bytes: int = 3000) -> str:
        return (super().log_tail(max_bytes) + self.stderr())[-max_bytes:]

    def wait_exit(self, timeout: float) -> int:
        """The exit status once the process is gone (-9: SIGKILL)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.pid} still alive after {timeout}s\n{self.log_tail()}"
            ) from None

    def kill_9(self) -> int:
        """kill -9 from outside; the exit status proves the signal landed."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=10)

    def failpoint_line(self, name: str) -> str:
        return f"quantdrift failpoint {name}: SIGKILL pid {self.pid}"


def shadow_records(route: str, tag: str, kind: str, n: int, seed: int) -> list[Record]:
    """``n`` healthy or drifted synthetic shadow pairs of ``route`` with unique ids."""
    source = synthetic.healthy if kind == "healthy" else synthetic.drifted
    pairs: list[PairEvent] = on_route(shadow_only(source(route, seed=seed), n), route, tag)
    return [(pair_record_key(p), p.dumps()) for p in pairs]


# -- Redis ---------------------------------------------------------------------


class RouteKeys:
    """Read one route's breaker keys (the layout of ``schemas/keys.py``)."""

    def __init__(self, redis_url: str, prefix: str, route: str) -> None:
        # Retried: a test that restarts Redis reads through a pooled connection it killed.
        self.client = aioredis.Redis.from_url(
            redis_url,
            socket_connect_timeout=1.0,
            socket_timeout=1.0,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 5),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
        )
        self.prefix, self.route = prefix, route

    def key(self, what: str) -> str:
        return route_key(self.prefix, self.route, what)

    async def state(self) -> RouteState:
        raw = await self.client.hget(self.key("state"), "s")
        return RouteState.from_json(json.loads(raw) if raw else None)

    async def outbox_len(self) -> int:
        return int(await self.client.llen(self.key("outbox")))

    async def claim_holder(self) -> str | None:
        raw = await self.client.get(self.key("outbox:owner"))
        return raw.decode() if raw else None

    async def duplicates(self) -> int:
        return int(await self.client.hget(self.key("stats"), "duplicates") or 0)

    async def drained(self) -> bool:
        """Nothing queued, nobody publishing: every command of the route was acked."""
        return await self.outbox_len() == 0 and await self.claim_holder() is None

    async def aclose(self) -> None:
        await self.client.aclose()


async def eventually(
    check: Callable[[], Awaitable[bool]],
    timeout: float,
    what: str,
    context: Callable[[], str] = lambda: "",
    interval: float = 0.05,
) -> float:
    """Poll an async condition; the time it took. Fails with ``context()`` after ``timeout``."""
    start = time.monotonic()
    while True:
        try:
            if await check():
                return time.monotonic() - start
        except (OSError, aioredis.RedisError):
            pass  # a Redis the test is restarting: try again
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{context()}")
        await asyncio.sleep(interval)


# -- the control topic -----------------------------------------------------------


async def control_commands(
    settings: Settings, route: str, verifier: CommandVerifier, timeout: float = 3.0
) -> list[RouteCommand]:
    """Every command of ``route`` on the control topic, each one's signature verified."""
    records = await records_for(
        settings.kafka.bootstrap_servers, settings.kafka.topics.control, route, timeout=timeout
    )
    return [verifier.open(r.value) for r in records]


# -- a gateway's RouteController ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    route: str
    epoch: int
    action: str
    pool: str
    source: str
    at: float  # monotonic


def gateway_routes(routes: Iterable[str]) -> dict[str, Any]:
    """The shape of examples/gateway.yaml: pools int4 and bf16, one entry per route."""
    return {
        "precisions": {"int4": ["http://127.0.0.1:9"], "bf16": ["http://127.0.0.1:9"]},
        "routes": {r: {"candidate": "int4", "reference": "bf16"} for r in routes},
    }


class Follower:
    """A RouteController built as ``quantdrift gateway`` builds it, logging what it applies."""

    def __init__(
        self, settings: Settings, redis_url: str, routes: Iterable[str], poll_s: float = 0.1
    ) -> None:
        routes = list(routes)
        config = parse_config(gateway_routes(routes))
        self.verifier = verifier_from_settings(
            settings.signing.keys,
            settings.signing.max_command_age_s,
            settings.signing.max_clock_skew_s,
        )
        self.controller = RouteController(
            settings.kafka,
            redis_url,
            self.verifier,
            key_prefix=settings.redis.key_prefix,
            routes=routes,
            poll_interval_s=poll_s,
            resolve=resolver_for(config),
            redis_options={"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        )
        self.applied: list[Applied] = []
        self.controller.on_change(self._record)

    def _record(self, route: str, command: RouteCommand) -> None:
        state = self.controller.state(route)
        assert state is not None
        self.applied.append(
            Applied(
                route,
                command.epoch,
                command.action,
                state.target_precision,
                state.source,
                state.applied_at,
            )
        )

    async def start(self) -> Follower:
        await self.controller.start()
        assert await self.controller.wait_kafka_ready(30), "controller never followed the topic"
        return self

    async def stop(self) -> None:
        await self.controller.stop()

    def epochs(self, route: str) -> list[int]:
        return [a.epoch for a in self.applied if a.route == route]

    def actions(self, route: str) -> list[str]:
        return [a.action for a in self.applied if a.route == route]


# -- a Redis that forgets ------------------------------------------------------------


class VolatileRedis:
    """A redis-server we own on a fixed port, with nothing on disk: killed, it forgets.

    The opposite of ``PersistentRedis``: the embedded Redis and the ones on these
    machines keep nothing, so kill -9 and a start on the same address is a Redis
    that lost every route's state while clients reconnect to it as before.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="qd-faults-volatile-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> VolatileRedis:
        argv = [
            default_server_bin(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.dir),
        ]  # fmt: skip
        log = (self.dir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if redis_ping(self.url, timeout=0.3):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def kill_9(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        status = self.proc.wait(timeout=10)
        self.proc = None
        return status

    def close(self) -> None:
        if self.proc is not None:
            stop_popen(self.proc, timeout=5.0)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
