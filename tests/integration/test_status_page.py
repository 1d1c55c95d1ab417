"""The worker's status page in a real headless browser, /metrics and /healthz on a real worker.

Needs Debian's chromium (``apt-get install -y chromium``); the test installs nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from quantdrift.config import EmbeddingSettings
from quantdrift.demo import synthetic
from quantdrift.demo.workers import WorkerProcess
from quantdrift.stack.ports import free_port
from support.browser import CHROMIUM, chromium_dom
from support.guard import isolated_settings, make_topics, wait_until
from support.kafka import produce
from support.redis_keys import forget_prefix
from support.workers import start_worker


def rows(dom: str) -> dict[str, dict[str, str]]:
    found = {}
    body = dom[dom.index("<tbody>") : dom.index("</tbody>")]  # not the script's source
    for m in re.finditer(r'<tr class="route" ([^>]*)>', body):
        attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', m.group(1)))
        found[attrs["route"]] = attrs
    return found


CALM, STORMY = "faq/int8", "cs-agent/int4"


@pytest.fixture(scope="module")
def worker(stack, tmp_path_factory) -> Iterator[tuple[object, WorkerProcess, str]]:  # type: ignore[no-untyped-def]
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    policy = tmp_path_factory.mktemp("status") / "policy.yaml"
    # No embedder in this test (ROUGE-L stands in): the window rule's 0.85 is cosine-scale.
    policy.write_text("default:\n  rules: [consecutive]\n")
    port = free_port()
    base = isolated_settings(stack, prefix)
    settings = base.model_copy(
        update={
            "policy_file": Path(policy),
            "embedding": EmbeddingSettings(model="none"),
            "worker": base.worker.model_copy(update={"web_port": port}),
        }
    )
    asyncio.run(make_topics(settings))
    proc = start_worker(settings, stack.redis_url)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 60, "the worker's /healthz", proc)
        yield settings, proc, url
    finally:
        proc.stop()
        forget_prefix(stack.redis_url, prefix)


def send(settings, pairs) -> None:  # type: ignore[no-untyped-def]
    items = [(p.route.encode(), p.dumps()) for p in pairs]
    asyncio.run(produce(settings.kafka.bootstrap_servers, settings.kafka.topics.pairs, items))


def shadow(route: str, stream, n: int, tag: str):  # type: ignore[no-untyped-def]
    picked = itertools.islice((p for p in stream if p.kind == "shadow"), n)
    return [p.model_copy(update={"route": route, "pair_id": f"{tag}-{p.pair_id}"}) for p in picked]


def route_json(url: str) -> dict[str, dict[str, object]]:
    data = httpx.get(url + "/status.json", timeout=2).json()
    return {r["route"]: r for r in data["routes"]}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed: apt-get install -y chromium")
def test_status_page_renders_routes_and_updates_in_a_browser(worker) -> None:  # type: ignore[no-untyped-def]
    settings, proc, url = worker
    calm, stormy = synthetic.healthy(CALM), synthetic.healthy(STORMY)
    send(settings, shadow(CALM, calm, 8, "a") + shadow(STORMY, stormy, 8, "a"))
    wait_until(
        lambda: {r: v["pairs_seen"] for r, v in route_json(url).items()} == {CALM: 8, STORMY: 8},
        30,
        "both routes on /status.json",
        proc,
    )
    first = rows(chromium_dom(url + "/status"))
    assert set(first) == {CALM, STORMY}
    assert first[STORMY]["state"] == "closed" and first[STORMY]["pairs"] == "8"
    # min_pairs is 20: warming, so not armed yet, on the page and in /status.json.
    assert first[STORMY]["armed"] == "false"
    assert route_json(url)[STORMY]["readiness"] == "warming"
    # More healthy pairs, then drift: the stormy route must trip (min_pairs 20, K=3).
    send(settings, shadow(STORMY, synthetic.healthy(STORMY, seed=3), 14, "b"))
    send(settings, shadow(STORMY, synthetic.drifted(STORMY), 4, "c"))
    wait_until(lambda: route_json(url)[STORMY]["state"] == "open", 30, "the trip", proc)
    dom = chromium_dom(url + "/status")
    second = rows(dom)
    # Epochs follow the breaker's clock in ms (they survive Redis loss): the page shows
    # the same epoch the store holds, not a counter.
    stormy = route_json(url)[STORMY]
    assert second[STORMY]["state"] == "open" and int(second[STORMY]["epoch"]) == stormy["epoch"]
    assert stormy["trips"] == 1
    assert second[CALM]["state"] == "closed"
    assert int(second[STORMY]["pairs"]) > 20
    # the sparkline is drawn from the history the page polled, and the page kept polling
    assert re.search(r'<svg class="spark"[^>]*data-n="(\d+)"', dom)
    assert int(re.search(r'data-polls="(\d+)"', dom).group(1)) >= 2  # type: ignore[union-attr]


def test_metrics_and_healthz(worker) -> None:  # type: ignore[no-untyped-def]
    settings, proc, url = worker
    send(settings, shadow(CALM, synthetic.healthy(CALM, seed=5), 3, "m"))
    wait_until(
        lambda: (
            "quantdrift_pairs_scored_total" in httpx.get(url + "/metrics", timeout=2).text
            and route_json(url).get(CALM, {}).get("pairs_seen", 0) >= 3
        ),
        30,
        "metrics",
        proc,
    )
    resp = httpx.get(url + "/metrics", timeout=2)
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    scored = float(re.search(r"^quantdrift_pairs_scored_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert scored >= 3
    assert f'quantdrift_breaker_state{{route="{CALM}"}} 0' in text
    assert re.search(r'^quantdrift_scoring_seconds_bucket\{le="\+Inf"\} [1-9]', text, re.M)
    assert "quantdrift_dead_letters_total 0" in text
    health = httpx.get(url + "/healthz", timeout=2)
    assert health.status_code == 200 and health.json()["ok"] is True
    assert health.json()["stalled"] == {}
    # The stall watch's first look fills the lag of every partition the worker holds
    # (it read an attribute this Faust does not have, and the lag was always empty).
    topics = settings.kafka.topics
    wait_until(
        lambda: "quantdrift_consumer_lag{" in httpx.get(url + "/metrics", timeout=2).text,
        30,
        "the consumer lag on /metrics",
        proc,
    )
    lag = httpx.get(url + "/status.json", timeout=2).json()["consumer_lag"]
    assert {tp.rsplit("/", 1)[0] for tp in lag} == {topics.pairs, topics.scores}, lag
    assert all(v == 0 for v in lag.values()), f"caught up, yet behind: {lag}"
