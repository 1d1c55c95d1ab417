"""``quantdrift alerts tail|forward``: on-call's view of the alerts topic, and its pager.

``tail`` prints one coloured line per alert (``--evidence`` for the why,
``--json`` for machines); ``forward`` posts grouped, deduped alerts to an
Alertmanager (``/api/v2/alerts``) and/or a Slack-compatible webhook.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from quantdrift.cli.common import load_settings, parse_time, with_stack


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alerts", help="tail the alerts, or forward them to webhooks")
    cmds = p.add_subparsers(dest="alerts_command", required=True)
    t = cmds.add_parser("tail", help="one line per alert, coloured")
    t.add_argument("--route", help="only this route")
    t.add_argument("--since", default="1h", help="1h, 30m, ISO time or epoch (default 1h)")
    t.add_argument("--follow", action=argparse.BooleanOptionalAction, default=False)
    t.add_argument("--evidence", action="store_true", help="print each alert's evidence")
    t.add_argument("--json", action="store_true", help="one JSON object per line")
    t.set_defaults(func=run_tail)
    f = cmds.add_parser("forward", help="post alerts to Alertmanager / Slack webhooks")
    f.add_argument("--alertmanager", help="Alertmanager base URL (POST {URL}/api/v2/alerts)")
    f.add_argument("--slack", help="Slack-compatible incoming webhook URL")
    f.add_argument("--group", default=None, help="consumer group (default <app_id>-alerts)")
    f.add_argument("--group-wait", type=float, default=10.0, help="s to wait for siblings")
    f.add_argument("--group-interval", type=float, default=300.0, help="s between updates")
    f.add_argument("--max-alerts", type=int, default=None, help="stop after N alerts")
    f.add_argument("--idle-exit", type=float, default=None, help="stop after N s idle")
    f.set_defaults(func=run_forward)


def run_tail(args: argparse.Namespace) -> int:
    from rich.console import Console

    from quantdrift.alerts.tail import format_alert, read_alerts
    from quantdrift.kafka_clients import consumer_kwargs

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


def run_forward(args: argparse.Namespace) -> int:
    from quantdrift.alerts.forward import run_forward as forward
    from quantdrift.alerts.sinks import AlertGrouper, WebhookSink
    from quantdrift.kafka_clients import consumer_kwargs

    if not args.alertmanager and not args.slack:
        raise SystemExit("quantdrift: error: alerts forward needs --alertmanager and/or --slack")
    settings = with_stack(load_settings())
    sinks = []
    if args.alertmanager:
        url = args.alertmanager.rstrip("/")
        if not url.endswith("/api/v2/alerts"):
            url += "/api/v2/alerts"
        sinks.append(WebhookSink(url, "alertmanager"))
    if args.slack:
        sinks.append(WebhookSink(args.slack, "slack"))
    stats = asyncio.run(
        forward(
            consumer_kwargs(settings.kafka),
            settings.kafka.topics.alerts,
            sinks,
            AlertGrouper(group_wait_s=args.group_wait, group_interval_s=args.group_interval),
            group_id=args.group or f"{settings.worker.app_id}-alerts",
            max_alerts=args.max_alerts,
            idle_exit_s=args.idle_exit,
        )
    )
    print(json.dumps(stats.__dict__))
    return 0
