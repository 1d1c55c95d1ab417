"""Driving a real gateway end to end: child processes, the control topic, ``ask``.

What the rollback tests (``tests/integration/test_rollback_e2e.py`` on the lab's
models, ``tests/vllm/test_vllm_rollback.py`` on vLLM) share: a child process with
its log, a watch on the control topic, one greedy SDK request on ``ROUTE`` and the
gateway's own view of that route.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer

from quantdrift.schemas import RouteCommand
from quantdrift.stack.ports import stop_popen

ROUTE = "cs-agent/int4"
MAX_TOKENS = 12


def child_env(extra: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        **extra,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


@dataclass
class Child:
    """A ``quantdrift ...`` child process with its log in ``logs``."""

    name: str
    argv: list[str]
    logs: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.logs / f"{self.name}.log"

    def start(self) -> Child:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "quantdrift", *self.argv],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            env=child_env(self.env),
            cwd=self.logs,  # never a developer's .quantdrift/stack.json
        )
        return self

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    async def healthy(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1.0) as client:
            while True:
                with suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return
                assert self.proc is not None and self.proc.poll() is None, self.tail()
                assert time.monotonic() < deadline, f"{self.name} not up:\n{self.tail()}"
                await asyncio.sleep(0.25)

    def stop(self) -> None:
        if self.proc is not None:
            stop_popen(self.proc, timeout=10)


def lab(logs: Path, name: str, variant: str, port: int) -> Child:
    argv = ["lab", "serve", "--precision", variant, "--port", str(port), "--threads", "1"]
    return Child(name, argv, logs).start()


@dataclass
class Seen:
    command: RouteCommand
    published: float  # the record's timestamp (wall clock, s)
    received: float  # when the test's consumer read it (wall clock, s)


class ControlWatch:
    """Reads every signed command of the run's control topic as it is published."""

    def __init__(self, bootstrap: str, topic: str, verify: Callable[[bytes], RouteCommand]):
        self.seen: list[Seen] = []
        self._changed = asyncio.Condition()
        self._consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
        )
        self._verify = verify
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for record in self._consumer:
            seen = Seen(self._verify(record.value), record.timestamp / 1000, time.time())
            async with self._changed:
                self.seen.append(seen)
                self._changed.notify_all()

    async def wait(self, action: str, after_epoch: int, timeout: float) -> Seen:
        def found() -> Seen | None:
            return next(
                (
                    s
                    for s in self.seen
                    if s.command.action == action and s.command.epoch > after_epoch
                ),
                None,
            )

        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: found() is not None)
        result = found()
        assert result is not None
        return result

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()


@dataclass
class Reply:
    status: int
    precision: str
    text: str
    sent: float  # wall clock
    ended: float


async def ask(client: Any, prompt: str, max_tokens: int = MAX_TOKENS) -> Reply:
    """One greedy chat on ``ROUTE`` through the OpenAI SDK: status, serving side, text."""
    sent = time.time()
    raw = await client.chat.completions.with_raw_response.create(
        model=ROUTE,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
    )
    completion = raw.parse()
    return Reply(
        raw.http_response.status_code,
        raw.headers.get("x-quantdrift-precision", ""),
        completion.choices[0].message.content or "",
        sent,
        time.time(),
    )


async def gateway_route(http: httpx.AsyncClient) -> dict[str, Any]:
    body = (await http.get("/health")).json()
    return dict(body["routes"][ROUTE])


async def until_gateway(
    http: httpx.AsyncClient, check: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> tuple[dict[str, Any], float]:
    """Poll the gateway's /health until its view of the route passes ``check``."""
    deadline = time.monotonic() + timeout
    while True:
        route = await gateway_route(http)
        if check(route):
            return route, time.time()
        assert time.monotonic() < deadline, f"gateway never reached {what}: {route}"
        await asyncio.sleep(0.05)
