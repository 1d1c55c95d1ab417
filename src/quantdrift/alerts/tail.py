"""Read the alerts topic: ``alerts tail`` (on-call's terminal) and the forwarder's loop.

The tail is a group-less consumer: it never commits and never steals
partitions from anyone. ``--since`` seeks by timestamp and, because Tansu
answers a timestamp lookup with offset 0, also filters on each alert's ``ts``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from rich.text import Text

from quantdrift.alerts.pairs import worst_lines
from quantdrift.errors import SchemaError
from quantdrift.kafka_clients import reader_kwargs, start_client
from quantdrift.schemas import AlertEvent

SEVERITY_STYLE = {"P0": "bold white on red", "P1": "bold red", "P2": "yellow", "P3": "cyan"}


def format_alert(alert: AlertEvent, evidence: bool = False) -> Text:
    """One readable line (``evidence``: plus the evidence, indented JSON).

    >>> a = AlertEvent(alert_id="r#2", severity="P1", route="r", kind="breaker.open",
    ...                summary="r: closed -> open", ts=0.0, dedupe_key="k", epoch=2)
    >>> format_alert(a).plain[20:]
    'P1 r breaker.open epoch 2  r: closed -> open'
    """
    when = datetime.fromtimestamp(alert.ts).strftime("%Y-%m-%d %H:%M:%S")
    line = Text()
    line.append(f"{when} ", style="dim")
    line.append(alert.severity, style=SEVERITY_STYLE.get(alert.severity, ""))
    line.append(f" {alert.route} ", style="bold")
    line.append(alert.kind, style="magenta")
    line.append(f" epoch {alert.epoch}" if alert.epoch is not None else "", style="dim")
    line.append(f"  {alert.summary}")
    for worst in worst_lines(alert.evidence):
        line.append(f"\n    worst: {worst}")
    if evidence and alert.evidence:
        body = json.dumps(alert.evidence, indent=2, sort_keys=True, default=str)
        line.append("\n" + "\n".join("    " + ln for ln in body.splitlines()), style="dim")
    return line


async def read_alerts(
    consumer_options: dict[str, Any],
    topic: str,
    *,
    since: float | None = None,
    route: str | None = None,
    follow: bool = False,
    group_id: str | None = None,
    stop: Callable[[], bool] | None = None,
    on_bad: Callable[[bytes | None, str], None] | None = None,
    heartbeat: bool = False,
    to_commit: Callable[[], dict[Any, int]] | None = None,
) -> AsyncIterator[tuple[AlertEvent | None, Any, int]]:
    """Yield (alert, topic-partition, offset) from ``topic``; forever when ``follow``.

    Without ``follow`` it stops at the high watermarks of its first fetch.
    With a ``group_id`` (the forwarder) it resumes from the group's offsets;
    the caller commits. ``heartbeat`` also yields ``(None, None, -1)`` after
    every poll, so a caller can run its timers when no alert arrives;
    ``to_commit`` (group consumers) returns the offsets safe to commit now.
    """
    consumer = AIOKafkaConsumer(**reader_kwargs(consumer_options, group_id))
    await start_client(consumer, str(consumer_options.get("bootstrap_servers")))
    try:
        await consumer.topics()
        parts = consumer.partitions_for_topic(topic) or set()
        while group_id is None and not parts:
            # A fresh stack has no alerts topic before the first alert: nothing to read
            # yet, and assigning no partitions would make aiokafka's fetch assert.
            if not follow or (stop is not None and stop()):
                return
            if heartbeat:
                yield None, None, -1
            await asyncio.sleep(1.0)
            await consumer.topics()  # refreshes the metadata
            parts = consumer.partitions_for_topic(topic) or set()
        if group_id is None:
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            if since is not None and tps:
                found = await consumer.offsets_for_times({tp: int(since * 1000) for tp in tps})
                for tp in tps:
                    hit = found.get(tp)
                    if hit is not None:
                        consumer.seek(tp, hit.offset)
                    else:
                        await consumer.seek_to_end(tp)
            else:
                await consumer.seek_to_beginning(*tps)
        else:
            consumer.subscribe([topic])
        stops: dict[Any, int] = {}
        while True:
            if stop is not None and stop():
                return
            batches = await consumer.getmany(timeout_ms=300)
            for tp, records in batches.items():
                for r in records:
                    try:
                        if r.value is None:
                            raise SchemaError("empty record")
                        alert = AlertEvent.parse(r.value)
                    except SchemaError as exc:
                        if on_bad is not None:
                            on_bad(r.value, str(exc))
                        continue
                    if since is not None and alert.ts < since:
                        continue
                    if route is not None and alert.route != route:
                        continue
                    yield alert, tp, r.offset
            if heartbeat:
                yield None, None, -1
            if to_commit is not None and group_id is not None and (offsets := to_commit()):
                await consumer.commit(offsets)
            if not follow and group_id is None:
                assigned = consumer.assignment()
                for tp in assigned:
                    if tp not in stops and (hw := consumer.highwater(tp)) is not None:
                        stops[tp] = hw
                if len(stops) == len(assigned) and all(
                    [await consumer.position(tp) >= stops[tp] for tp in assigned]
                ):
                    return
    finally:
        await consumer.stop()
