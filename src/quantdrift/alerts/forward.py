"""``quantdrift alerts forward``: the alerts topic to Alertmanager / Slack webhooks.

Its own consumer group; an offset is committed only once every alert read up to
it was delivered to every sink, or dead-lettered. A sink that fails is retried
with backoff (only that sink, only that group); after ``max_attempts`` the group's
alerts go to the DLQ with the reason. A crash or a stop before then re-reads the
uncommitted alerts, so a page is sent at least once, never silently lost.
``supervise_forward`` restarts the loop after an unexpected error, logged and
counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from quantdrift.alerts.sinks import AlertGroup, AlertGrouper, WebhookSink
from quantdrift.alerts.tail import read_alerts
from quantdrift.kafka_clients import start_client
from quantdrift.schemas import DeadLetter

log = logging.getLogger("quantdrift.alerts")

DeadLetterAlerts = Callable[[AlertGroup, str], Awaitable[None]]


@dataclass
class ForwardStats:
    alerts: int = 0
    duplicates: int = 0
    groups_sent: int = 0
    failures: int = 0
    retries: int = 0
    dead_lettered: int = 0
    commits: int = 0
    restarts: int = 0


@dataclass
class _Retry:
    sink: WebhookSink
    group: AlertGroup
    attempts: int
    next_at: float


async def run_forward(
    consumer_options: dict[str, Any],
    topic: str,
    sinks: Sequence[WebhookSink],
    grouper: AlertGrouper,
    *,
    group_id: str,
    max_alerts: int | None = None,
    idle_exit_s: float | None = None,
    clock: Callable[[], float] = time.time,
    max_attempts: int = 20,
    retry_backoff_s: float = 1.0,
    retry_max_backoff_s: float = 60.0,
    dead_letter: DeadLetterAlerts | None = None,
    stats: ForwardStats | None = None,
) -> ForwardStats:
    """Forward until ``max_alerts`` are delivered or ``idle_exit_s`` pass with no alert.

    Without ``dead_letter`` a failing sink is retried for as long as the loop runs
    (and the offset stays uncommitted).
    """
    stats = stats if stats is not None else ForwardStats()
    pending: dict[Any, int] = {}
    retries: list[_Retry] = []
    last_alert = time.monotonic()

    def done() -> bool:
        delivered = grouper.pending == 0 and not retries
        if max_alerts is not None and stats.alerts >= max_alerts and delivered:
            return True
        return idle_exit_s is not None and time.monotonic() - last_alert > idle_exit_s

    def safe_offsets() -> dict[Any, int]:
        # Only when every alert read so far went out (or to the DLQ): nothing is lost.
        if grouper.pending or retries or not pending:
            return {}
        out = dict(pending)
        pending.clear()
        stats.commits += 1
        return out

    async def attempt(sink: WebhookSink, group: AlertGroup, attempts: int) -> None:
        if await sink.send(group):
            stats.groups_sent += 1
            return
        stats.failures += 1
        if dead_letter is not None and attempts >= max_attempts:
            reason = f"{sink.kind} sink {sink.display}: not delivered after {attempts} attempts"
            await dead_letter(group, reason)
            stats.dead_lettered += len(group.alerts)
            log.error("%s: %d alert(s) of %s dead-lettered", reason, len(group.alerts), group.route)
            return
        delay = min(retry_backoff_s * 2 ** (attempts - 1), retry_max_backoff_s)
        log.warning(
            "%s sink %s: %d alert(s) of %s not delivered (attempt %d); retrying in %.1f s",
            sink.kind,
            sink.display,
            len(group.alerts),
            group.route,
            attempts,
            delay,
        )
        retries.append(_Retry(sink, group, attempts, clock() + delay))

    reader = read_alerts(
        consumer_options,
        topic,
        group_id=group_id,
        follow=True,
        stop=done,
        heartbeat=True,
        to_commit=safe_offsets,
    )
    try:
        async for alert, tp, offset in reader:
            if alert is not None:
                last_alert = time.monotonic()
                stats.alerts += 1
                if not grouper.add(alert, clock()):
                    stats.duplicates += 1
                pending[tp] = offset + 1
            for group in grouper.due(clock()):
                for sink in sinks:
                    await attempt(sink, group, 1)
            now = clock()
            due = [r for r in retries if r.next_at <= now]
            for r in due:
                retries.remove(r)
                stats.retries += 1
                await attempt(r.sink, r.group, r.attempts + 1)
    finally:
        await reader.aclose()  # type: ignore[attr-defined]
        # Best effort at exit; nothing is committed past here, so what fails is re-read.
        for group in grouper.flush(clock()):
            for sink in sinks:
                if await sink.send(group):
                    stats.groups_sent += 1
                else:
                    stats.failures += 1
        if retries:
            log.warning("stopping with %d undelivered group(s); they are re-read", len(retries))
    return stats


async def supervise_forward(
    run: Callable[[ForwardStats], Awaitable[ForwardStats]],
    *,
    restart_backoff_s: float = 1.0,
    max_backoff_s: float = 30.0,
    max_restarts: int | None = None,
) -> ForwardStats:
    """Run the forwarder; an unexpected error is logged with its traceback, counted and
    the loop restarted (it resumes from the committed offsets, so nothing is skipped).

    Kept small and local to the forwarder: a process-wide supervisor can replace it.
    """
    stats = ForwardStats()
    delay = restart_backoff_s
    while True:
        try:
            return await run(stats)
        except asyncio.CancelledError:
            raise
        except Exception:
            stats.restarts += 1
            log.exception("alert forwarder failed; restart %d in %.1f s", stats.restarts, delay)
            if max_restarts is not None and stats.restarts > max_restarts:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff_s)


@contextlib.asynccontextmanager
async def kafka_dead_letters(
    producer_options: dict[str, Any], dlq_topic: str, alerts_topic: str
) -> AsyncIterator[DeadLetterAlerts]:
    """``dead_letter(group, reason)``: each alert of the group to the DLQ, acknowledged by
    the broker before it returns (only then may the forwarder commit past it)."""
    # Deferred: aiokafka loads only in a process that forwards alerts.
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**producer_options)
    # A producer whose start failed is closed here, and the failure is one BrokerError line.
    await start_client(producer, str(producer_options.get("bootstrap_servers")))

    async def dead_letter(group: AlertGroup, reason: str) -> None:
        for alert in group.alerts:
            letter = DeadLetter.of(alert.dumps(), topic=alerts_topic, key=alert.route, error=reason)
            await producer.send_and_wait(dlq_topic, letter.dumps(), key=alert.route.encode())

    try:
        yield dead_letter
    finally:
        await producer.stop()
