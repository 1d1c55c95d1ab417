"""``quantdrift alerts tail|forward``: on-call's view of the alerts topic, and its pager.

``tail`` prints one coloured line per alert (``--evidence`` for the why,
``--json`` for machines); ``forward`` posts grouped, deduped alerts to an
Alertmanager (``/api/v2/alerts``) and/or a Slack-compatible webhook. The Slack
URL is a secret: it comes from ``QUANTDRIFT_ALERTS__SLACK_WEBHOOK_URL`` or a file
(``--slack-file`` / ``QUANTDRIFT_ALERTS__SLACK_WEBHOOK_FILE``); ``--slack URL``
still works but puts the secret on the command line, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from quantdrift.alerts.forward import kafka_dead_letters, supervise_forward
from quantdrift.alerts.forward import run_forward as forward
from quantdrift.alerts.sinks import AlertGrouper, WebhookSink
from quantdrift.alerts.tail import format_alert, read_alerts
from quantdrift.cli.common import consumer_loop_options, parse_time
from quantdrift.cli.settings import load_settings, with_stack
from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs


def run_tail(args: argparse.Namespace) -> int:
    settings = with_stack(load_settings())
    console = Console(highlight=False, soft_wrap=True)
    since = parse_time(args.since)

    async def go() -> int:
        n = 0
        async for alert, _, _ in read_alerts(
            consumer_kwargs(settings.kafka),
            settings.kafka.topics.alerts,
            since=since,
            route=args.route,
            follow=args.follow,
        ):
            if alert is None:
                continue
            n += 1
            if args.json:
                sys.stdout.write(alert.dumps().decode() + "\n")
                sys.stdout.flush()
            else:
                console.print(format_alert(alert, evidence=args.evidence))
        return n

    n = asyncio.run(go())
    if not args.json and n == 0:
        console.print("[dim]no alerts[/dim]")
    return 0


def slack_url(args: argparse.Namespace, settings: Any) -> str | None:
    """The Slack webhook URL from a file, the environment, or (deprecated) argv."""
    path = args.slack_file or settings.alerts.slack_webhook_file
    if path is not None:
        try:
            url = Path(path).read_text().strip()
        except OSError as exc:
            raise SystemExit(
                f"quantdrift: error: cannot read the Slack webhook file: {exc}"
            ) from None
        if not url:
            raise SystemExit(f"quantdrift: error: the Slack webhook file {path} is empty")
        return url
    if settings.alerts.slack_webhook_url is not None:
        return str(settings.alerts.slack_webhook_url.get_secret_value())
    if args.slack:
        sys.stderr.write(
            "quantdrift: warning: --slack puts the webhook URL (a secret) on the command "
            "line; set QUANTDRIFT_ALERTS__SLACK_WEBHOOK_URL or use --slack-file\n"
        )
        return str(args.slack)
    return None


def run_forward(args: argparse.Namespace) -> int:
    settings = with_stack(load_settings())
    slack = slack_url(args, settings)
    if not args.alertmanager and not slack:
        raise SystemExit(
            "quantdrift: error: alerts forward needs --alertmanager and/or a Slack webhook "
            "(QUANTDRIFT_ALERTS__SLACK_WEBHOOK_URL or --slack-file)"
        )
    sinks = []
    if args.alertmanager:
        url = args.alertmanager.rstrip("/")
        if not url.endswith("/api/v2/alerts"):
            url += "/api/v2/alerts"
        sinks.append(WebhookSink(url, "alertmanager"))
    if slack:
        sinks.append(WebhookSink(slack, "slack"))
    grouper = AlertGrouper(group_wait_s=args.group_wait, group_interval_s=args.group_interval)

    async def go() -> Any:
        dead_letters = kafka_dead_letters(
            producer_kwargs(settings.kafka), settings.kafka.topics.dlq, settings.kafka.topics.alerts
        )
        async with dead_letters as dead_letter:
            return await supervise_forward(
                lambda stats: forward(
                    consumer_kwargs(settings.kafka),
                    settings.kafka.topics.alerts,
                    sinks,
                    grouper,
                    max_attempts=args.max_attempts,
                    dead_letter=dead_letter,
                    stats=stats,
                    **consumer_loop_options(args, settings),
                )
            )

    stats = asyncio.run(go())
    print(json.dumps(stats.__dict__))
    return 0
