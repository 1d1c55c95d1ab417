"""On-call: alert sinks (Alertmanager, Slack) with dedupe and grouping; the alerts tail."""

from quantdrift.alerts.sinks import (
    AlertGroup,
    AlertGrouper,
    WebhookSink,
    alertmanager_payload,
    deliver,
    slack_payload,
)
from quantdrift.alerts.tail import format_alert, read_alerts

__all__ = [
    "AlertGroup",
    "AlertGrouper",
    "WebhookSink",
    "alertmanager_payload",
    "deliver",
    "format_alert",
    "read_alerts",
    "slack_payload",
]
