"""``quantdrift alerts forward``: the alerts topic to Alertmanager / Slack webhooks.

Its own consumer group; offsets are committed only when nothing read is still
waiting in a group, so a crash re-reads (and the dedupe key drops) rather
than loses an alert.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from quantdrift.alerts.sinks import AlertGrouper, WebhookSink, deliver
from quantdrift.alerts.tail import read_alerts


@dataclass
class ForwardStats:
    alerts: int = 0
    duplicates: int = 0
    groups_sent: int = 0
    failures: int = 0
    commits: int = 0


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
) -> ForwardStats:
    stats = ForwardStats()
    pending: dict[Any, int] = {}
    last_alert = time.monotonic()

    def done() -> bool:
        if max_alerts is not None and stats.alerts >= max_alerts and grouper.pending == 0:
            return True
        return idle_exit_s is not None and time.monotonic() - last_alert > idle_exit_s

    def safe_offsets() -> dict[Any, int]:
        # Only when every alert read so far has gone out: then nothing can be lost.
        if grouper.pending or not pending:
            return {}
        out = dict(pending)
        pending.clear()
        stats.commits += 1
        return out

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
            groups = grouper.due(clock())
            if groups:
                ok = await deliver(sinks, groups)
                stats.groups_sent += len(groups)
                stats.failures += 0 if ok else 1
    finally:
        await reader.aclose()  # type: ignore[attr-defined]
        leftover = grouper.flush(clock())
        if leftover:
            await deliver(sinks, leftover)
            stats.groups_sent += len(leftover)
    return stats
