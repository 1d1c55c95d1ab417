"""The fixtures every tier may ask for, registered once by ``tests/conftest.py``.

* ``stack``: the embedded broker and a Redis (the machine's, or one started), once per
  session;
* ``redis_prefix``: a key prefix only this test uses, every key under it deleted after;
* ``redis_store``: the Redis breaker store under that prefix (the worker's store);
* ``kafka_consume``: ``await kafka_consume(topic, n, timeout=10.0)`` on the session broker;
* ``worker_process``: ``worker_process(settings)`` starts a ``quantdrift worker``
  (:func:`support.workers.start_worker`) and stops it when the test ends;
* ``scripted_llm``: the scripted OpenAI-compatible upstream (:mod:`support.scripted_llm`);
* ``scripted`` / ``scripted_memory``: the gateway tests' upstream with a behaviour per
  path (:mod:`support.gateway_upstream`), on the wire or in memory, one per module;
* ``receiver``: an OTLP/HTTP receiver (:mod:`support.otlp`) that decodes what a real
  process exports.

Options: ``--fault-schedule short|long``, ``--fault-hold S``, ``--fault-seed N`` and
``--fault-rows FILE`` choose the fault rig's schedule (``tests/faults/test_fault_schedule.py``):
``make test`` runs the short one, ``make bench-faults`` the long one.
``--fault-worker-nice N`` starts the rig's workers at niceness N, to compare the
users' latency while a worker catches up a backlog on the cores the gateway shares.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.schemas import CommandSigner
from quantdrift.stack import EmbeddedStack
from support.gateway_upstream import (  # noqa: F401 - registered as fixtures here
    scripted,
    scripted_memory,
)
from support.kafka import consume_n
from support.otlp import receiver  # noqa: F401 - registered as a fixture here
from support.redis_keys import forget_prefix
from support.scripted_llm import ScriptedLLM
from support.workers import start_worker

STORE_SIGNER = CommandSigner("test", b"support-redis-store-signing-key")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quantdrift fault schedule")
    group.addoption(
        "--fault-schedule",
        choices=["short", "long"],
        default="short",
        help="the fault rig's cases: short (make test) or every case (make bench-faults)",
    )
    group.addoption("--fault-hold", type=float, default=None, help="seconds each fault lasts")
    group.addoption("--fault-seed", type=int, default=41, help="the long schedule's order")
    group.addoption("--fault-rows", default=None, help="append each case's row (JSONL) here")
    group.addoption(
        "--fault-worker-nice", type=int, default=0, help="run the rig's workers at this niceness"
    )


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    """Tansu on a free port plus a Redis (the machine's, or one we start), once per session."""
    with EmbeddedStack() as started:
        yield started


@pytest.fixture
def redis_prefix(stack: EmbeddedStack) -> Iterator[str]:
    """A key prefix only this test uses; every key under it is deleted afterwards."""
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    yield prefix
    forget_prefix(stack.redis_url, prefix)


@pytest.fixture
async def redis_store(stack: EmbeddedStack, redis_prefix: str) -> AsyncIterator[RedisBreakerStore]:
    """The Redis breaker store under this test's prefix, signing with ``STORE_SIGNER``."""
    client = aioredis.Redis.from_url(stack.redis_url)
    try:
        yield RedisBreakerStore(client, STORE_SIGNER, key_prefix=redis_prefix)
    finally:
        await client.aclose()


@pytest.fixture
def kafka_consume(stack: EmbeddedStack) -> Callable[..., Awaitable[list[Any]]]:
    """``await kafka_consume(topic, n, timeout=10.0)`` against the session broker."""

    async def _consume(topic: str, n: int, **kwargs: Any) -> list[Any]:
        return await consume_n(stack.bootstrap, topic, n, **kwargs)

    return _consume


@pytest.fixture
def worker_process() -> Iterator[Callable[..., WorkerProcess]]:
    """``worker_process(settings, redis_url=None, **kw)``: a started worker, stopped at the
    end of the test whatever happened to it (a test may kill or stop it first)."""
    started: list[WorkerProcess] = []

    def start(settings: Settings, redis_url: str | None = None, **kw: Any) -> WorkerProcess:
        worker = start_worker(settings, redis_url, **kw)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def scripted_llm() -> Iterator[ScriptedLLM]:
    """The scripted upstream, started for one test (``llm.texts[tag]`` sets a model's answer)."""
    llm = ScriptedLLM().start()
    yield llm
    llm.stop()
