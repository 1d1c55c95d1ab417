"""Helpers for fault tests: isolated settings, pacing, waiting on Redis state, a restartable Redis.

The guard-loop helpers in ``tests/integration`` are reused by path (``guard``,
``kafka_helpers``); the few that live inside a test module there are small
enough to restate here rather than import a test module.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from quantdrift.breaker.state import RouteState
from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.schemas import PairEvent, RouteCommand
from quantdrift.stack import default_server_bin, free_port, redis_ping
from quantdrift.stack.ports import stop_popen

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from guard import isolated_settings, make_topics
from kafka_helpers import consume_n

__all__ = [
    "PersistentRedis",
    "consume_n",
    "isolated_settings",
    "make_topics",
    "on_route",
    "records_for",
    "route_state",
    "send_pairs",
    "shadow_only",
    "until_seen",
    "wait_scored",
]


def shadow_only(pairs: Iterator[PairEvent], n: int) -> list[PairEvent]:
    return list(itertools.islice((p for p in pairs if p.kind == "shadow"), n))


def on_route(pairs: list[PairEvent], route: str, tag: str) -> list[PairEvent]:
    return [p.model_copy(update={"route": route, "pair_id": f"{tag}-{p.pair_id}"}) for p in pairs]


async def send_pairs(
    bootstrap: str,
    topic: str,
    items: list[tuple[bytes | None, bytes | None]],
    rate_per_s: float | None = None,
) -> dict[bytes, float]:
    """Produce records (paced if ``rate_per_s``); returns each value's send time (monotonic)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=8 * 1024 * 1024
    )
    await producer.start()
    sent: dict[bytes, float] = {}
    try:
        if rate_per_s is None:
            futures = [await producer.send(topic, value, key=key) for key, value in items]
            await asyncio.gather(*futures)
            now = time.monotonic()
            sent = {v: now for _, v in items if v is not None}
        else:
            start = time.monotonic()
            for i, (key, value) in enumerate(items):
                delay = start + i / rate_per_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if value is not None:
                    sent[value] = time.monotonic()
                await producer.send(topic, value, key=key)
            await producer.flush()
    finally:
        await producer.stop()
    return sent


async def route_state(redis_url: str, prefix: str, route: str) -> RouteState:
    client = aioredis.Redis.from_url(redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)
    try:
        raw = await client.hget(f"{prefix}route:{route}:state", "s")
    finally:
        await client.aclose()
    return RouteState.from_json(orjson.loads(raw) if raw else None)


async def until_seen(
    settings: Settings,
    route: str,
    n: int,
    worker: WorkerProcess,
    timeout: float = 60.0,
) -> RouteState:
    """Wait until the judge has folded n shadow pairs of ``route`` (a condition, not a sleep)."""
    assert settings.redis.url is not None
    deadline = time.monotonic() + timeout
    while True:
        state = await route_state(settings.redis.url, settings.redis.key_prefix, route)
        if state.pairs_seen >= n:
            return state
        assert worker.alive(), f"worker died:\n{worker.log_tail()}"
        assert time.monotonic() < deadline, (
            f"{route}: {state.pairs_seen}/{n} pairs judged after {timeout}s\n{worker.log_tail()}"
        )
        await asyncio.sleep(0.1)


async def wait_scored(settings: Settings, worker: WorkerProcess, timeout: float = 120.0) -> None:
    """Send one throwaway pair and wait for it to be judged: the worker is up and in its group."""
    from quantdrift.demo import synthetic

    route = "warmup/int4"
    pair = on_route(shadow_only(synthetic.healthy(route, seed=0), 1), route, "warm")[0]
    await send_pairs(
        settings.kafka.bootstrap_servers,
        settings.kafka.topics.pairs,
        [(route.encode(), pair.dumps())],
    )
    await until_seen(settings, route, 1, worker, timeout=timeout)


async def records_for(
    bootstrap: str, topic: str, route: str | None = None, timeout: float = 3.0
) -> list[Any]:
    """Every record of ``topic`` (for ``route`` if given) readable within ``timeout``."""
    got = await consume_n(bootstrap, topic, 1_000_000, timeout=timeout, strict=False)
    return [r for r in got if route is None or r.key == route.encode()]


def commands_on(records: list[Any]) -> list[tuple[str, int]]:
    return [(c.action, c.epoch) for c in (RouteCommand.parse(r.value) for r in records)]


class PersistentRedis:
    """A redis-server we own, on a fixed port, with an fsync-always AOF.

    ``start_redis_server`` picks a new free port each time and runs without
    persistence, which is right for a throwaway server but cannot be restarted:
    a production Redis comes back on its address with its data, so this one
    does too (same port, same ``--dir``).
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="qd-faults-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> PersistentRedis:
        argv = [
            default_server_bin(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--dir", str(self.dir),
        ]  # fmt: skip
        log = (self.dir / "redis.log").open("ab")
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if redis_ping(self.url, timeout=0.3):
                return self
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def stop(self) -> None:
        if self._proc is not None:
            stop_popen(self._proc, timeout=5.0)
            self._proc = None

    def close(self) -> None:
        self.stop()
        for path in sorted(self.dir.rglob("*"), reverse=True):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        os.rmdir(self.dir)
