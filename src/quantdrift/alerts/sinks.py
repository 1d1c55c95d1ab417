"""Alert sinks: Alertmanager- and Slack-compatible webhooks, with dedupe and grouping.

A drift storm must be one page. Two layers make it so:

* **dedupe** on ``AlertEvent.dedupe_key`` (derived from route and epoch, so a
  redelivered or re-sent outbox is the same key): a key seen within
  ``dedupe_ttl_s`` is dropped;
* **grouping** per route, Alertmanager's way: the first alert of a route waits
  ``group_wait_s`` for its siblings, then the group goes out as ONE
  notification; alerts arriving later are held and sent together at most once
  per ``group_interval_s``.

:class:`AlertGrouper` is pure (time is a parameter); :class:`WebhookSink`
does the HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from quantdrift.alerts.pairs import worst_lines
from quantdrift.schemas import AlertEvent

log = logging.getLogger("quantdrift.alerts")

_SEVERITY_RANK = {"P0": 0, "P1": 1, "P2": 2, "P3": 3}


@dataclass(frozen=True, slots=True)
class AlertGroup:
    route: str
    alerts: tuple[AlertEvent, ...]

    @property
    def severity(self) -> str:
        return min((a.severity for a in self.alerts), key=_SEVERITY_RANK.__getitem__)


@dataclass
class _RouteGroup:
    pending: list[AlertEvent] = field(default_factory=list)
    first_pending_at: float | None = None
    last_sent_at: float | None = None


@dataclass
class AlertGrouper:
    """Dedupe by key, group by route; ``due(now)`` returns what to send now.

    Examples
    --------
    >>> from quantdrift.schemas import AlertEvent
    >>> def alert(epoch):
    ...     return AlertEvent(alert_id=f"r#{epoch}", severity="P1", route="r", kind="breaker.open",
    ...                       summary="s", ts=0.0, dedupe_key=f"r:open:{epoch}")
    >>> g = AlertGrouper(group_wait_s=5, group_interval_s=60)
    >>> [g.add(alert(1), now=0.0), g.add(alert(1), now=1.0), g.add(alert(2), now=2.0)]
    [True, False, True]
    >>> g.due(now=4.0), [len(x.alerts) for x in g.due(now=5.0)]
    ([], [2])
    """

    group_wait_s: float = 10.0
    group_interval_s: float = 300.0
    dedupe_ttl_s: float = 6 * 3600.0
    seen: dict[str, float] = field(default_factory=dict)
    routes: dict[str, _RouteGroup] = field(default_factory=dict)
    duplicates: int = 0

    def add(self, alert: AlertEvent, now: float) -> bool:
        """Queue an alert; False when its dedupe key was already seen."""
        self.seen = {k: t for k, t in self.seen.items() if now - t < self.dedupe_ttl_s}
        if alert.dedupe_key in self.seen:
            self.duplicates += 1
            return False
        self.seen[alert.dedupe_key] = now
        group = self.routes.setdefault(alert.route, _RouteGroup())
        if not group.pending:
            group.first_pending_at = now
        group.pending.append(alert)
        return True

    def due(self, now: float) -> list[AlertGroup]:
        out = []
        for route, g in self.routes.items():
            if not g.pending or g.first_pending_at is None:
                continue
            if g.last_sent_at is None or now - g.last_sent_at >= self.group_interval_s:
                ready = now - g.first_pending_at >= self.group_wait_s
                if g.last_sent_at is not None:
                    ready = now - g.last_sent_at >= self.group_interval_s
                if ready:
                    out.append(AlertGroup(route, tuple(g.pending)))
                    g.pending, g.first_pending_at, g.last_sent_at = [], None, now
        return out

    def flush(self, now: float) -> list[AlertGroup]:
        """Everything pending, whatever the timers say (at shutdown)."""
        out = []
        for route, g in self.routes.items():
            if g.pending:
                out.append(AlertGroup(route, tuple(g.pending)))
                g.pending, g.first_pending_at, g.last_sent_at = [], None, now
        return out

    @property
    def pending(self) -> int:
        return sum(len(g.pending) for g in self.routes.values())


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def alertmanager_payload(group: AlertGroup, generator_url: str = "") -> list[dict[str, Any]]:
    """Alertmanager's ``POST /api/v2/alerts`` body: a list of alerts with labels.

    Labels identify the alert (Alertmanager dedupes on them); the latest
    transition of the route is the one that stays firing.
    """
    out = []
    for a in group.alerts:
        item: dict[str, Any] = {
            "labels": {
                "alertname": "QuantdriftBreaker",
                "route": a.route,
                "severity": a.severity,
                "kind": a.kind,
                "dedupe_key": a.dedupe_key,
            },
            "annotations": {
                "summary": a.summary,
                "evidence": json.dumps(a.evidence, sort_keys=True, default=str)[:4000],
            },
            "startsAt": _iso(a.ts),
        }
        if generator_url:
            item["generatorURL"] = generator_url
        out.append(item)
    return out


def slack_payload(group: AlertGroup) -> dict[str, Any]:
    """A Slack-compatible incoming-webhook body: one message per group."""
    latest = group.alerts[-1]
    head = f"[{group.severity}] {group.route}: {latest.summary}"
    if len(group.alerts) > 1:
        head += f"\n({len(group.alerts)} alerts grouped)"
        head += "".join(f"\n• [{a.severity}] {a.kind} epoch {a.epoch}" for a in group.alerts)
    rule = latest.evidence.get("rule")
    worst = worst_lines(latest.evidence)
    if rule:
        head += f"\nrule: {rule}"
    if worst:
        head += "\nworst pairs:" + "".join(f"\n• {line}" for line in worst)
    return {"text": head}


def redact_url(url: str) -> str:
    """The URL as logs may show it: scheme and host, never credentials or the path.

    A Slack incoming-webhook URL *is* its secret (the path is the token), and any URL
    may carry ``user:password@``.

    >>> redact_url("https://hooks.slack.com/services/T000/B000/XXXXSECRET")
    'https://hooks.slack.com/…'
    >>> redact_url("http://am:pw@alertmanager:9093/api/v2/alerts")
    'http://alertmanager:9093/…'
    """
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/…"


@dataclass
class WebhookSink:
    """POST each group to a URL in one of the two shapes; retries with backoff.

    ``url`` is a secret for Slack: logs show ``display`` (host only), and ``repr``
    leaves the URL out.
    """

    url: str = field(repr=False)
    kind: str  # "alertmanager" | "slack"
    client: httpx.AsyncClient | None = None
    retries: int = 3
    timeout_s: float = 5.0
    sent: int = 0
    failed: int = 0

    @property
    def display(self) -> str:
        return redact_url(self.url)

    def body(self, group: AlertGroup) -> Any:
        if self.kind == "alertmanager":
            return alertmanager_payload(group)
        if self.kind == "slack":
            return slack_payload(group)
        raise ValueError(f"unknown sink kind {self.kind!r}")

    async def send(self, group: AlertGroup) -> bool:
        body = self.body(group)
        client = self.client or httpx.AsyncClient(timeout=self.timeout_s)
        try:
            delay = 0.2
            for attempt in range(1, self.retries + 1):
                try:
                    resp = await client.post(self.url, json=body)
                    if resp.status_code < 300:
                        self.sent += 1
                        return True
                    log.warning(
                        "%s sink: HTTP %s from %s (attempt %d)",
                        self.kind,
                        resp.status_code,
                        self.display,
                        attempt,
                    )
                except httpx.HTTPError as exc:
                    # The exception's text may quote the URL: name its type only.
                    log.warning(
                        "%s sink: %s from %s (attempt %d)",
                        self.kind,
                        type(exc).__name__,
                        self.display,
                        attempt,
                    )
                if attempt < self.retries:
                    await asyncio.sleep(delay)
                    delay *= 2
            self.failed += 1
            return False
        finally:
            if self.client is None:
                await client.aclose()


async def deliver(sinks: Sequence[WebhookSink], groups: Sequence[AlertGroup]) -> bool:
    """Send every group to every sink; True when all succeeded."""
    ok = True
    for group in groups:
        for sink in sinks:
            ok &= await sink.send(group)
    return ok
