"""deploy/prometheus/alerts.yml: the rules parse, fire on the series they are for, and
query only metrics the code exports.

promtool (Debian's ``prometheus`` package; ``make promtool`` installs it, ``make test``
depends on that) checks the rules and the Prometheus config and runs the rule unit
tests in deploy/prometheus/alerts_test.yml. The metric names are checked here against
what a real worker collector and a real ``Gateway`` render, so a renamed metric fails
this test rather than silencing an alert.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
# The alerts on-call asked for, by what they watch.
REQUIRED = {
    "QuantdriftBreakerOpen": "quantdrift_breaker_state",
    "QuantdriftConsumerLag": "quantdrift_consumer_lag",
    "QuantdriftDeadLetters": "quantdrift_dead_letters_total",
    "QuantdriftShadowDrops": "quantdrift_gateway_shadow_dropped_total",
    "QuantdriftControlNotReady": "quantdrift_gateway_control_ready",
}
# Series Prometheus itself writes for every target.
PROMETHEUS_OWN = {"up"}


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROM / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def exported_names(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+)", text, re.M))


def worker_metrics() -> set[str]:
    from quantdrift.breaker.state import RouteState
    from quantdrift.status.page import LatencyHistogram, metrics_text
    from quantdrift.streams.agents import WorkerStats

    text = metrics_text(WorkerStats(), {"r": RouteState()}, LatencyHistogram(), {"t/0": 1})
    return exported_names(text)


def gateway_metrics() -> set[str]:
    """A Gateway with a publisher and a controller (neither started: nothing connects)."""
    from quantdrift.config import KafkaSettings
    from quantdrift.gateway.control.controller import RouteController
    from quantdrift.gateway.gateway_config import GatewayConfig
    from quantdrift.gateway.http.service import Gateway
    from quantdrift.gateway.shadow.publisher import ShadowPublisher
    from quantdrift.schemas.signing import CommandVerifier

    config = GatewayConfig.model_validate(
        {
            "precisions": {"int4": ["http://127.0.0.1:9"], "bf16": ["http://127.0.0.1:9"]},
            "routes": {"r": {"candidate": "int4", "reference": "bf16"}},
        }
    )
    controller = RouteController(
        KafkaSettings(), "redis://127.0.0.1:9/0", CommandVerifier({"k": b"k" * 32})
    )
    gateway = Gateway(
        config, publisher=ShadowPublisher(KafkaSettings(), 0.05), controller=controller
    )
    # The controller has not reached the control topic: the alert's condition holds.
    assert gateway.metrics.value("quantdrift_gateway_control_ready") == 0.0
    return exported_names(gateway.metrics.render().decode())


def test_required_alerts_with_severity_and_runbook() -> None:
    by_name = {rule["alert"]: rule for rule in rules()}
    for name, metric in REQUIRED.items():
        rule = by_name[name]
        assert metric in rule["expr"], name
        assert rule["labels"]["severity"] in {"page", "ticket"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name}: fires on one scrape"


def test_rules_query_only_metrics_the_code_exports() -> None:
    exported = worker_metrics() | gateway_metrics() | PROMETHEUS_OWN
    functions = {"max", "sum", "rate", "clamp_min", "by", "without", "and", "or", "unless"}
    for rule in rules():
        expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", rule["expr"])  # drop matchers, ranges
        names = set(re.findall(r"\b([a-z_][a-z0-9_]*)\b", expr)) - functions
        grouped = re.findall(r"by \(([^)]*)\)", expr)
        names -= {label.strip() for labels in grouped for label in labels.split(",")}
        assert names, rule["alert"]
        missing = sorted(n for n in names if n not in exported)
        assert not missing, f"{rule['alert']} queries {missing}, which nothing exports"


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool: make promtool (Debian's prometheus)")
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    assert PROMTOOL is not None
    for args in (
        ["check", "rules", "alerts.yml"],
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        out = subprocess.run(
            [PROMTOOL, *args], cwd=PROM, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}{out.stderr}"
    # Every required alert has a firing case in the rule unit tests.
    tests = yaml.safe_load((PROM / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert set(REQUIRED) <= fired
