"""Fault-test fixtures: one embedded stack for the suite, with its own Redis.

``redis_probe_url=None``: the faults suite never touches the machine's Redis,
even under its own prefix, because some tests flood or restart what they use.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.stack import EmbeddedStack
from support.guard import isolated_settings, make_topics, wait_scored
from support.workers import start_worker


@pytest.fixture(scope="session")
def fault_stack() -> Iterator[EmbeddedStack]:
    with EmbeddedStack(redis_probe_url=None) as started:
        yield started


@pytest.fixture(scope="session")
def fault_worker(fault_stack: EmbeddedStack) -> Iterator[tuple[Settings, WorkerProcess]]:
    """One worker on its own topics and prefix, shared by the tests that do not break it."""
    prefix = f"qdfault:{uuid.uuid4().hex}:"
    settings = isolated_settings(fault_stack, prefix, partitions=2)
    asyncio.run(make_topics(settings))
    worker = start_worker(settings, fault_stack.redis_url)
    try:
        asyncio.run(wait_scored(settings, worker))
        yield settings, worker
    finally:
        worker.stop()
