"""Alert sinks against a local HTTP receiver; forward and tail against the embedded broker."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from quantdrift.alerts.forward import run_forward
from quantdrift.alerts.sinks import AlertGroup, AlertGrouper, WebhookSink
from quantdrift.cli import main
from quantdrift.config import KafkaSettings
from quantdrift.kafka_clients import consumer_kwargs
from quantdrift.schemas import AlertEvent

try:
    from kafka_helpers import produce, unique_topic
except ImportError:  # pragma: no cover
    from tests.integration.kafka_helpers import produce, unique_topic


class Receiver:
    """A webhook receiver on a free port; records (path, JSON body); answers ``status``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.calls.append((self.path, json.loads(body)))
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def alert(route: str, epoch: int) -> AlertEvent:
    return AlertEvent(
        alert_id=f"{route}#{epoch}",
        severity="P1",
        route=route,
        kind="breaker.open",
        summary=f"{route}: closed -> open",
        evidence={"rule": "window"},
        ts=1_700_000_000.0 + epoch,
        dedupe_key=f"{route}:open:{epoch}",
        epoch=epoch,
    )


async def test_webhook_sinks_post_both_shapes(receiver: Receiver) -> None:
    group = AlertGroup("a", (alert("a", 1), alert("a", 2)))
    am = WebhookSink(receiver.url + "/api/v2/alerts", "alertmanager")
    slack = WebhookSink(receiver.url + "/hook", "slack")
    assert await am.send(group) and await slack.send(group)
    (p1, b1), (p2, b2) = receiver.calls
    assert p1 == "/api/v2/alerts" and isinstance(b1, list) and len(b1) == 2
    assert b1[0]["labels"]["route"] == "a"
    assert p2 == "/hook" and isinstance(b2, dict) and b2["text"].startswith("[P1] a:")


async def test_webhook_sink_retries_then_counts_a_failure(receiver: Receiver) -> None:
    receiver.status = 500
    sink = WebhookSink(receiver.url + "/hook", "slack", retries=2)
    assert not await sink.send(AlertGroup("a", (alert("a", 1),)))
    assert len(receiver.calls) == 2 and sink.failed == 1


@pytest.mark.integration
def test_forward_turns_a_storm_into_one_page_per_route(stack, receiver: Receiver) -> None:  # type: ignore[no-untyped-def]
    topic = unique_topic("alerts")
    storm = [alert("cs-agent/int4", i % 5) for i in range(40)] + [alert("faq/int8", 1)]
    asyncio.run(produce(stack.bootstrap, topic, [(a.route.encode(), a.dumps()) for a in storm]))
    options = consumer_kwargs(KafkaSettings(bootstrap_servers=stack.bootstrap))
    sinks = [
        WebhookSink(receiver.url + "/api/v2/alerts", "alertmanager"),
        WebhookSink(receiver.url + "/slack", "slack"),
    ]
    stats = asyncio.run(
        run_forward(
            options,
            topic,
            sinks,
            AlertGrouper(group_wait_s=0.5, group_interval_s=60),
            group_id=f"{topic}-fwd",
            max_alerts=len(storm),
            idle_exit_s=15,
        )
    )
    assert stats.alerts == 41 and stats.duplicates == 35
    slack = [b for p, b in receiver.calls if p == "/slack"]
    am = [b for p, b in receiver.calls if p == "/api/v2/alerts"]
    assert len(slack) == 2 and len(am) == 2  # one page per route
    routes = sorted(item[0]["labels"]["route"] for item in am)  # type: ignore[index]
    assert routes == ["cs-agent/int4", "faq/int8"]
    assert sorted(len(b) for b in am) == [1, 5]  # type: ignore[arg-type]
    assert stats.commits >= 1


@pytest.mark.integration
def test_alerts_tail_cli(stack, monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    topic = unique_topic("alerts")
    old = alert("faq/int8", 1).model_copy(update={"ts": 1_000.0})
    items = [old, alert("cs-agent/int4", 2), alert("faq/int8", 3)]
    asyncio.run(produce(stack.bootstrap, topic, [(a.route.encode(), a.dumps()) for a in items]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS", stack.bootstrap)
    monkeypatch.setenv("QUANTDRIFT_KAFKA__TOPICS__ALERTS", topic)
    assert main(["alerts", "tail", "--since", "1600000000", "--json", "--no-follow"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(a["epoch"] for a in got) == [2, 3]  # ts filter, though Tansu seeks to 0
    assert main(["alerts", "tail", "--since", "1600000000", "--route", "faq/int8"]) == 0
    out = capsys.readouterr().out
    assert "faq/int8 breaker.open epoch 3" in out and "cs-agent" not in out
