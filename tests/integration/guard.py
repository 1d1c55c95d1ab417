"""Helpers for guard-loop tests: isolated settings and a worker process per test module."""

from __future__ import annotations

import time
import uuid

from quantdrift.config import KafkaSettings, RedisSettings, Settings, TopicNames, WorkerSettings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.stack import EmbeddedStack
from quantdrift.stack.broker import create_topics


def isolated_settings(stack: EmbeddedStack, prefix: str, partitions: int = 2) -> Settings:
    """Own topics, consumer group and Redis prefix: tests share the broker, nothing else."""
    tag = uuid.uuid4().hex[:8]
    topics = TopicNames(
        **{name: f"t{tag}.{value}" for name, value in TopicNames().model_dump().items()}
    )
    return Settings(
        kafka=KafkaSettings(
            bootstrap_servers=stack.bootstrap, partitions=partitions, topics=topics
        ),
        redis=RedisSettings(url=stack.redis_url, key_prefix=prefix),
        worker=WorkerSettings(
            app_id=f"qdtest-{tag}",
            web_port=0,
            broker_session_timeout_s=3.0,
            broker_heartbeat_interval_s=0.5,
        ),
    )


async def make_topics(settings: Settings) -> None:
    await create_topics(
        settings.kafka.bootstrap_servers,
        settings.kafka.topics.model_dump().values(),
        settings.kafka.partitions,
    )


def wait_until(predicate, timeout: float, what: str, worker: WorkerProcess | None = None) -> None:  # type: ignore[no-untyped-def]
    """Poll a condition (not a sleep for ordering): fail with the worker's log tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if worker is not None and not worker.alive():
            raise AssertionError(f"worker died while waiting for {what}:\n{worker.log_tail()}")
        time.sleep(0.05)
    tail = worker.log_tail() if worker else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tail}")
