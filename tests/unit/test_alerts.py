"""Alert grouping, dedupe and payload shapes: pure, time moved by hand."""

from __future__ import annotations

import pytest

from quantdrift.alerts import AlertGrouper, alertmanager_payload, format_alert, slack_payload
from quantdrift.alerts.sinks import AlertGroup
from quantdrift.schemas import AlertEvent


def alert(route: str, epoch: int, severity: str = "P1", kind: str = "breaker.open") -> AlertEvent:
    return AlertEvent(
        alert_id=f"{route}#{epoch}",
        severity=severity,  # type: ignore[arg-type]
        route=route,
        kind=kind,
        summary=f"{route}: closed -> open (rollback to reference)",
        evidence={"rule": "consecutive", "worst_pairs": [{"pair_id": f"p{epoch}"}]},
        ts=1_700_000_000.0 + epoch,
        dedupe_key=f"{route}:open:{epoch}",
        epoch=epoch,
    )


def test_storm_is_one_page_per_route() -> None:
    g = AlertGrouper(group_wait_s=5, group_interval_s=60)
    # 50 alerts for route a (each sent 3 times: redeliveries), 2 for route b, in 4 s
    for i in range(50):
        for _ in range(3):
            g.add(alert("a", i), now=i * 0.08)
    g.add(alert("b", 1), now=1.0)
    g.add(alert("b", 2), now=2.0)
    assert g.duplicates == 100
    assert g.due(4.9) == []
    groups = g.due(6.0)
    assert sorted((x.route, len(x.alerts)) for x in groups) == [("a", 50), ("b", 2)]
    # later alerts of a route wait for the group interval, then go out together
    g.add(alert("a", 60), now=10.0)
    g.add(alert("a", 61), now=20.0)
    assert g.due(30.0) == []
    later = g.due(66.0)
    assert [(x.route, [a.epoch for a in x.alerts]) for x in later] == [("a", [60, 61])]
    assert g.pending == 0


def test_dedupe_ttl_expires() -> None:
    g = AlertGrouper(group_wait_s=0, dedupe_ttl_s=100)
    assert g.add(alert("a", 1), now=0.0)
    assert not g.add(alert("a", 1), now=50.0)
    assert g.add(alert("a", 1), now=150.0)


def test_alertmanager_payload_shape() -> None:
    body = alertmanager_payload(AlertGroup("a", (alert("a", 1), alert("a", 2, "P2"))))
    assert isinstance(body, list) and len(body) == 2
    assert body[0]["labels"] == {
        "alertname": "QuantdriftBreaker",
        "route": "a",
        "severity": "P1",
        "kind": "breaker.open",
        "dedupe_key": "a:open:1",
    }
    assert body[0]["annotations"]["summary"].startswith("a: closed -> open")
    assert body[0]["startsAt"] == "2023-11-14T22:13:21Z"


def test_slack_payload_is_one_text() -> None:
    group = AlertGroup("a", (alert("a", 1, "P2"), alert("a", 2, "P1")))
    body = slack_payload(group)
    assert set(body) == {"text"}
    assert body["text"].startswith("[P1] a: ")
    assert "2 alerts grouped" in body["text"] and "worst pairs:\n• p2" in body["text"]


@pytest.mark.parametrize("evidence", [False, True])
def test_format_alert_line(evidence: bool) -> None:
    text = format_alert(alert("cs-agent/int4", 3), evidence=evidence).plain
    assert "P1 cs-agent/int4 breaker.open epoch 3" in text
    assert ('"rule": "consecutive"' in text) is evidence
