"""The flags of ``quantdrift alerts`` (what it runs: ``quantdrift.cli.alerts``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import (
    add_consumer_options,
    add_seconds,
    positive_int,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alerts")
    cmds = p.add_subparsers(dest="alerts_command", required=True)
    t = cmds.add_parser("tail", help="one line per alert, coloured")
    t.add_argument("--route", help="only this route")
    t.add_argument("--since", default="1h", help="1h, 30m, ISO time or epoch (default 1h)")
    t.add_argument("--follow", action=argparse.BooleanOptionalAction, default=False)
    t.add_argument("--evidence", action="store_true", help="print each alert's evidence")
    t.add_argument("--json", action="store_true", help="one JSON object per line")
    t.set_defaults(func="run_tail")
    f = cmds.add_parser("forward", help="post alerts to Alertmanager / Slack webhooks")
    f.add_argument("--alertmanager", help="Alertmanager base URL (POST {URL}/api/v2/alerts)")
    f.add_argument(
        "--slack",
        help="deprecated (visible in ps): use QUANTDRIFT_ALERTS__SLACK_WEBHOOK_URL or --slack-file",
    )
    f.add_argument(
        "--slack-file", type=Path, help="file holding the Slack-compatible incoming webhook URL"
    )
    f.add_argument(
        "--max-attempts",
        type=positive_int,
        default=20,
        help="deliveries tried per sink before the alerts go to the DLQ (default 20)",
    )
    add_seconds(f, "group-wait", 10.0, "seconds to wait for siblings")
    add_seconds(f, "group-interval", 300.0, "seconds between updates")
    add_consumer_options(f, "alerts", "alerts")
    f.set_defaults(func="run_forward")
