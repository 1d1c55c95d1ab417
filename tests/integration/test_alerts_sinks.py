"""Alert sinks against a local HTTP receiver; forward and tail against the embedded broker."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from quantdrift.alerts.forward import (
    ForwardStats,
    kafka_dead_letters,
    run_forward,
    supervise_forward,
)
from quantdrift.alerts.sinks import AlertGroup, AlertGrouper, WebhookSink, slack_payload
from quantdrift.cli import main
from quantdrift.config import KafkaSettings
from quantdrift.kafka_clients import consumer_kwargs, producer_kwargs
from quantdrift.schemas import AlertEvent, DeadLetter
from support.kafka import consume_n, produce, unique_topic


class Receiver:
    """A webhook receiver on a free port; records (path, JSON body); answers ``status``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.status = 200
        self.fail_next = 0  # answer 500 to this many requests first
        self.statuses: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.calls.append((self.path, json.loads(body)))
                status = outer.status
                if outer.fail_next > 0:
                    outer.fail_next -= 1
                    status = 500
                outer.statuses.append(status)
                self.send_response(status)
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


async def committed(bootstrap: str, topic: str, group: str) -> int:
    """The sum of the group's committed offsets over the topic's partitions."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await consumer.client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or set()
        assert parts
        got = [await consumer.committed(TopicPartition(topic, p)) for p in parts]
        return sum(x or 0 for x in got)
    finally:
        await consumer.stop()


def forward_once(stack, topic: str, sink: WebhookSink, **kwargs: object) -> ForwardStats:  # type: ignore[no-untyped-def]
    options = consumer_kwargs(KafkaSettings(bootstrap_servers=stack.bootstrap))
    return asyncio.run(
        run_forward(
            options,
            topic,
            [sink],
            AlertGrouper(group_wait_s=0.1, group_interval_s=60),
            group_id=f"{topic}-fwd",
            retry_backoff_s=0.2,
            **kwargs,  # type: ignore[arg-type]
        )
    )


@pytest.mark.integration
def test_forward_redelivers_an_alert_its_sink_refused(stack, receiver: Receiver) -> None:  # type: ignore[no-untyped-def]
    """500, 500, then 200: the same alert goes out on the third try, then the offset moves."""
    topic = unique_topic("alerts")
    page = alert("cs-agent/int4", 7)
    asyncio.run(produce(stack.bootstrap, topic, [(page.route.encode(), page.dumps())]))
    receiver.fail_next = 2
    sink = WebhookSink(receiver.url + "/slack", "slack", retries=1)
    stats = forward_once(stack, topic, sink, max_alerts=1, idle_exit_s=30)
    assert receiver.statuses == [500, 500, 200]
    assert [b for _, b in receiver.calls] == [slack_payload(AlertGroup(page.route, (page,)))] * 3
    assert (stats.failures, stats.retries, stats.groups_sent) == (2, 2, 1)
    assert asyncio.run(committed(stack.bootstrap, topic, f"{topic}-fwd")) == 1


@pytest.mark.integration
def test_forward_never_commits_an_undelivered_alert(stack, receiver: Receiver) -> None:  # type: ignore[no-untyped-def]
    """A sink down for a whole run: the offset stays put, and the next run sends the alert.

    Before, the group's offset was committed after the failed delivery: the next run
    read nothing and the page was lost.
    """
    topic = unique_topic("alerts")
    page = alert("faq/int8", 3)
    asyncio.run(produce(stack.bootstrap, topic, [(page.route.encode(), page.dumps())]))
    receiver.status = 500
    sink = WebhookSink(receiver.url + "/slack", "slack", retries=1)
    down = forward_once(stack, topic, sink, idle_exit_s=3)
    assert down.alerts == 1 and down.groups_sent == 0 and down.failures >= 2
    assert asyncio.run(committed(stack.bootstrap, topic, f"{topic}-fwd")) == 0
    receiver.status, receiver.calls = 200, []
    up = forward_once(stack, topic, sink, max_alerts=1, idle_exit_s=30)
    assert up.alerts == 1 and up.groups_sent == 1
    assert [b for _, b in receiver.calls] == [slack_payload(AlertGroup(page.route, (page,)))]
    assert asyncio.run(committed(stack.bootstrap, topic, f"{topic}-fwd")) == 1


@pytest.mark.integration
def test_forward_dead_letters_after_max_attempts_then_commits(stack, receiver: Receiver) -> None:  # type: ignore[no-untyped-def]
    topic, dlq = unique_topic("alerts"), unique_topic("dlq")
    page = alert("cs-agent/int4", 9)
    asyncio.run(produce(stack.bootstrap, topic, [(page.route.encode(), page.dumps())]))
    receiver.status = 500
    sink = WebhookSink(receiver.url + "/slack", "slack", retries=1)

    async def go() -> ForwardStats:
        producer = producer_kwargs(KafkaSettings(bootstrap_servers=stack.bootstrap))
        async with kafka_dead_letters(producer, dlq, topic) as dead_letter:
            return await run_forward(
                consumer_kwargs(KafkaSettings(bootstrap_servers=stack.bootstrap)),
                topic,
                [sink],
                AlertGrouper(group_wait_s=0.1, group_interval_s=60),
                group_id=f"{topic}-fwd",
                retry_backoff_s=0.2,
                max_attempts=3,
                dead_letter=dead_letter,
                max_alerts=1,
                idle_exit_s=30,
            )

    stats = asyncio.run(go())
    assert (stats.failures, stats.dead_lettered) == (3, 1)
    (record,) = asyncio.run(consume_n(stack.bootstrap, dlq, 1, timeout=10))
    letter = DeadLetter.parse(record.value)
    assert AlertEvent.parse(letter.original()) == page and letter.topic == topic
    port = receiver.url.rsplit(":", 1)[1]
    assert letter.error == f"slack sink http://127.0.0.1:{port}/…: not delivered after 3 attempts"
    assert asyncio.run(committed(stack.bootstrap, topic, f"{topic}-fwd")) == 1


async def test_supervisor_logs_counts_and_restarts_the_loop(caplog) -> None:  # type: ignore[no-untyped-def]
    runs: list[int] = []

    async def flaky(stats: ForwardStats) -> ForwardStats:
        runs.append(stats.restarts)
        if len(runs) < 3:
            raise RuntimeError(f"boom {len(runs)}")
        return stats

    stats = await supervise_forward(flaky, restart_backoff_s=0.01)
    assert runs == [0, 1, 2] and stats.restarts == 2
    failures = [r for r in caplog.records if "alert forwarder failed" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures)


SECRET_HOOK_PATH = "/services/T0SECRET/B0SECRET/xoxSECRETTOKEN"


@pytest.mark.integration
def test_slack_url_comes_from_the_environment_and_never_reaches_a_log(  # type: ignore[no-untyped-def]
    stack, receiver: Receiver, monkeypatch, tmp_path, capsys, caplog
) -> None:
    topic = unique_topic("alerts")
    page = alert("cs-agent/int4", 4)
    asyncio.run(produce(stack.bootstrap, topic, [(page.route.encode(), page.dumps())]))
    receiver.status = 500  # the reply that used to log the URL
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS", stack.bootstrap)
    monkeypatch.setenv("QUANTDRIFT_KAFKA__TOPICS__ALERTS", topic)
    monkeypatch.setenv("QUANTDRIFT_ALERTS__SLACK_WEBHOOK_URL", receiver.url + SECRET_HOOK_PATH)
    argv = ["alerts", "forward", "--group-wait", "0.1", "--idle-exit", "3"]
    assert main(argv) == 0
    assert receiver.calls and all(path == SECRET_HOOK_PATH for path, _ in receiver.calls)
    out, err = capsys.readouterr()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP 500 from http://127.0.0.1" in logged
    for text in (out, err, logged, " ".join(argv)):
        assert "SECRET" not in text

    # The file form, and the deprecated flag (still works, and says why not to use it).
    hook = tmp_path / "slack-url"
    hook.write_text(receiver.url + SECRET_HOOK_PATH + "\n")
    monkeypatch.delenv("QUANTDRIFT_ALERTS__SLACK_WEBHOOK_URL")
    receiver.calls = []
    assert main([*argv, "--slack-file", str(hook)]) == 0
    assert receiver.calls and receiver.calls[0][0] == SECRET_HOOK_PATH
    receiver.calls = []
    assert main([*argv, "--slack", receiver.url + SECRET_HOOK_PATH]) == 0
    assert receiver.calls
    err = capsys.readouterr().err
    assert "--slack puts the webhook URL (a secret) on the command line" in err
