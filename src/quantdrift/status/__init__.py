"""The worker's status page, health check and Prometheus metrics (``attach_status``)."""

from quantdrift.status.page import History, LatencyHistogram, metrics_text, status_json
from quantdrift.status.web import attach_status

__all__ = ["History", "LatencyHistogram", "attach_status", "metrics_text", "status_json"]
