"""Roll back only what broke, as a user meets it: OpenAI SDK -> ``quantdrift gateway``
(its example config) -> scripted upstreams, a real worker (the static scorer tier), the
embedded stack, and a policy with ``rollback_scope: slice``.

The SDK sends English and Chinese. The candidate (int4) breaks on Chinese only: its
Chinese answers stutter ("首都首都首都…", a repetition the reference never shows, short
enough that the gateway's own loop guard lets it through), its English answers stay
healthy. The walk checks which pool serves each language, from the ``x-quantdrift-
precision`` header and from the calls each upstream received:

1. healthy: both languages on int4, the reference only in shadow; verdict ``pass``;
2. the drift: the ``language=zh`` slice trips, one signed command rolls back Chinese
   alone; the time from the command (its ``issued_at``) to the gateway serving Chinese
   from bf16 is measured; English stays on int4, Chinese goes to bf16 with no int4 call
   at all; the verdict API says ``fail`` for the slice and the route, ``route status``
   names the slice;
3. the candidate heals; after the cool-down (20 s) the slice half-opens (bf16 serves Chinese,
   int4 runs in shadow for it), passes its probe, and is restored: Chinese back on int4,
   the verdict ``pass`` again. On-call got one alert per transition, naming the slice.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.detectors.script import language_of
from quantdrift.stack import EmbeddedStack, free_port
from support.e2e import (
    Gateway,
    cli,
    example_config,
    isolated_world,
    route_verdict,
    start_gateway,
    verdict_api,
)
from support.guard import records_for, until_seen
from support.scripted_llm import ScriptedLLM
from support.workers import start_worker

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.timeout(300)]

ROUTE = "cs-agent/int4"  # the example config's route
TOKEN = "slice-e2e-verdict-token"
SALT = "slice-e2e-sample-salt-0123456789ab"
EN = [
    "The capital of France is Paris, a city on the Seine.",
    "Paris is the capital of France; the Seine runs through it.",
]
ZH = ["法国的首都是巴黎，位于塞纳河畔。", "巴黎是法国的首都，塞纳河从城中流过。"]
ZH_STUTTER = "首都首都首都首都首都首都是巴黎，法国的首都位于塞纳河畔，是一座历史悠久的美丽城市。"
COOLDOWN_S = 20.0  # the checks below run while the slice is held, on a busy host too
PROBE_PAIRS = 3
# The default rule (tolerance) judging slices by language, warming sooner than the
# defaults, and a slice-scoped rollback; the route relies on its hard and outcome tests
# (the scripted pairs make no floor for the divergence tests).
POLICY = {
    "default": {
        "min_pairs": 5,
        "slice_dimensions": ["language"],
        "slice_min_pairs": 5,
        "rollback_scope": "slice",
        "cooldown_s": COOLDOWN_S,
        "half_open_pairs": PROBE_PAIRS,
        "relies_on": ["hard", "outcomes"],
    }
}


def chinese(body: dict[str, Any]) -> bool:
    return language_of(str(body["messages"][-1]["content"])) == "zh"


@dataclass
class Upstreams:
    """int4 healthy in English; in Chinese healthy or stuttering (``broken``)."""

    llm: ScriptedLLM
    broken: bool = False

    def int4(self, body: dict[str, Any]) -> str | None:
        if not chinese(body):
            return None  # its fixed English answer
        return ZH_STUTTER if self.broken else ZH[0]

    def bf16(self, body: dict[str, Any]) -> str | None:
        if not chinese(body):
            return None  # its English paraphrases in turn
        return ZH[len(self.llm.calls_to("bf16")) % 2]

    def chinese_calls(self, tag: str) -> int:
        return sum(1 for body in self.llm.calls_to(tag) if chinese(body))


@pytest.fixture
def world(
    stack: EmbeddedStack, tmp_path: Path
) -> Iterator[tuple[Settings, WorkerProcess, dict[str, str], Upstreams, str]]:
    with isolated_world(stack, tmp_path, POLICY) as (settings, env):
        llm = ScriptedLLM().start()
        ups = Upstreams(llm)
        llm.texts["int4"] = EN[0]
        llm.variants["bf16"] = EN
        llm.answer["int4"] = ups.int4
        llm.answer["bf16"] = ups.bf16
        port = free_port()
        worker = start_worker(settings, stack.redis_url, web_port=port)
        status = f"http://127.0.0.1:{port}/status.json"  # the worker's status page
        try:
            yield settings, worker, env, ups, status
        finally:
            worker.stop()
            llm.stop()


@dataclass
class Reply:
    language: str
    text: str
    precision: str


class Users:
    """The openai SDK, one distinct prompt a request, in English or Chinese."""

    def __init__(self, gw: Gateway) -> None:
        self.client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        self.n = 0

    def ask(self, language: str) -> Reply:
        self.n += 1
        prompt = (
            f"What is the capital of France? ({self.n})"
            if language == "en"
            else f"法国的首都是哪里？请用一句话回答。({self.n})"
        )
        raw = self.client.chat.completions.with_raw_response.create(
            model=ROUTE,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            max_tokens=64,
        )
        reply = raw.parse()
        text = reply.choices[0].message.content or ""
        return Reply(language, text, raw.headers.get("x-quantdrift-precision", ""))


class SliceWatch:
    """Polls the gateway's ``/health`` every few ms from a thread: the wall-clock time at
    which it first showed the Chinese slice in each mode (how it would serve it)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SliceWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set():
                route = client.get(self.gw.url + "/health").json()["routes"][ROUTE]
                held = route["slices"].get("language=zh")
                mode = "restored" if held is None and "slice_half_open" in self.seen else None
                mode = held["mode"] if held is not None else mode
                if mode is not None and mode not in self.seen:
                    self.seen[mode] = time.time()
                time.sleep(0.003)

    def until(self, mode: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while mode not in self.seen:
            assert time.monotonic() < deadline, f"the gateway never showed {mode}: {self.seen}"
            time.sleep(0.01)
        return self.seen[mode]


def ask_verdict(base: str) -> dict[str, Any]:
    return route_verdict(base, ROUTE, TOKEN)


def route_row(status_url: str) -> dict[str, Any]:
    """The route's row on the worker's ``/status.json``."""
    rows = httpx.get(status_url, timeout=5).json()["routes"]
    (row,) = [r for r in rows if r["route"] == ROUTE]
    return dict(row)


def slice_verdicts(body: dict[str, Any]) -> dict[str, str]:
    return {row["slice"]: row["verdict"] for row in body["slices"]}


def test_a_chinese_drift_rolls_back_chinese_alone_and_restores_it(
    world: Any, tmp_path: Path
) -> None:
    settings, worker, env, ups, status = world
    config = example_config(ups.llm, SALT, noise_sample_rate=0.0, noise_fill={"max_rate": 0.0})
    gw = start_gateway(config, env, tmp_path, "gateway")
    users = Users(gw)
    timings: dict[str, float] = {}
    with verdict_api(env, tmp_path, TOKEN) as api, SliceWatch(gw) as watch:
        # 1. Healthy: both languages on the candidate.
        replies = [users.ask(lang) for lang in ("en", "zh") * 4]
        assert {(r.language, r.precision) for r in replies} == {("en", "int4"), ("zh", "int4")}
        assert {r.text for r in replies if r.language == "zh"} == {ZH[0]}
        asyncio.run(until_seen(settings, ROUTE, users.n, worker, timeout=60))
        body = ask_verdict(api)
        assert body["verdict"] == "pass", body
        assert slice_verdicts(body) == {
            "language=en": "inconclusive",
            "language=zh": "inconclusive",
        }

        # 2. The candidate stutters in Chinese only, 1 request in 4.
        ups.broken = True
        stuttered = 0
        while True:
            for lang in ("en", "en", "en", "zh"):
                reply = users.ask(lang)
                if lang == "en":
                    assert (reply.precision, reply.text) == ("int4", EN[0]), reply
                elif reply.precision == "int4":
                    assert reply.text == ZH_STUTTER  # the slice's users see the drift...
                    stuttered += 1
            state = asyncio.run(until_seen(settings, ROUTE, users.n, worker, timeout=30))
            if state.held:
                break
            assert stuttered < 40, "no slice rollback after 40 stuttered Chinese answers"
        assert state.state == "closed" and list(state.held) == ["language=zh"], state
        applied = watch.until("slice_rolled_back", timeout=10)
        body = ask_verdict(api)
        issued = body["last_transition"]["issued_at"]
        timings["command -> gateway serves zh from bf16 (s)"] = applied - issued
        print(f"\n{stuttered} stuttered Chinese answers reached users before the rollback")

        # ... and after it, only they are moved: Chinese from bf16 with no int4 call at all.
        int4_zh = ups.chinese_calls("int4")
        int4_all = len(ups.llm.calls_to("int4"))
        after = [users.ask(lang) for lang in ("en", "zh", "en", "zh")]
        assert [(r.language, r.precision) for r in after] == [
            ("en", "int4"), ("zh", "bf16"), ("en", "int4"), ("zh", "bf16"),
        ]  # fmt: skip
        assert all(r.text in ZH for r in after if r.language == "zh")
        assert ups.chinese_calls("int4") == int4_zh  # neither served nor shadowed
        assert len(ups.llm.calls_to("int4")) == int4_all + 2  # the two English users
        assert body["verdict"] == "fail", body
        assert body["reason"].startswith("slice language=zh rolled back"), body
        assert slice_verdicts(body)["language=zh"] == "fail"
        assert slice_verdicts(body)["language=en"] == "pass"
        out = cli(env, tmp_path, "route", "status", "--route", ROUTE)
        assert "slice language=zh  ROLLED BACK alone: its users on the reference" in out
        deadline = time.monotonic() + 15  # the worker's status page refreshes on a timer
        while not (held := route_row(status)["held_slices"]):
            assert time.monotonic() < deadline, "no held slice on the worker's /status.json"
            time.sleep(0.2)
        assert [(h["slice"], h["breaker"]) for h in held] == [("language=zh", "open")]
        health = gw.health()["routes"][ROUTE]
        assert health["serving"] == "int4"
        assert health["slices"] == {"language=zh": {"serving": "bf16", "mode": "slice_rolled_back"}}
        print(f"\n$ curl .../verdict\n{json.dumps({k: body[k] for k in ('verdict', 'reason')})}")

        # 3. The candidate heals; after the cool-down the slice half-opens and restores.
        ups.broken = False
        half = watch.until("slice_half_open", timeout=COOLDOWN_S + 15)
        timings["rollback -> half-open at the gateway (s)"] = half - applied
        before = ups.chinese_calls("int4")
        probes = [users.ask("zh") for _ in range(PROBE_PAIRS)]
        assert {r.precision for r in probes} == {"bf16"}  # users still on the reference
        ups_seen = time.monotonic() + 10
        while ups.chinese_calls("int4") < before + PROBE_PAIRS:  # the shadow is async
            assert time.monotonic() < ups_seen, "the candidate never ran in shadow for zh"
            time.sleep(0.02)
        restored = watch.until("restored", timeout=30)
        timings["half-open -> restored at the gateway (s)"] = restored - half
        back = [users.ask(lang) for lang in ("zh", "en")]
        assert [(r.language, r.precision, r.text) for r in back] == [
            ("zh", "int4", ZH[0]), ("en", "int4", EN[0]),
        ]  # fmt: skip
        deadline = time.monotonic() + 10
        while (body := ask_verdict(api))["verdict"] != "pass":
            assert time.monotonic() < deadline, body
            time.sleep(0.1)
    gw.stop()
    # Printed, not bounded here (a loaded CI host would make a bound flaky): the issue's
    # target is < 1 s, and the closing note reports what this printed.
    print("\n" + "\n".join(f"{k}: {v:.3f}" for k, v in timings.items()))
    assert timings["command -> gateway serves zh from bf16 (s)"] >= 0, timings  # after it

    topic = settings.kafka.topics.alerts
    records = asyncio.run(records_for(settings.kafka.bootstrap_servers, topic, ROUTE, timeout=2.0))
    alerts = [json.loads(r.value) for r in records]
    kinds = [a["kind"] for a in alerts]
    assert kinds == ["breaker.open", "breaker.half_open", "breaker.closed"], kinds
    assert all("[slice language=zh]" in a["summary"] for a in alerts), alerts
    opened = alerts[0]
    assert opened["severity"] == "P1" and opened["evidence"]["rule"] == "tolerance:hard@language=zh"
    print("\non-call's alert:\n" + json.dumps(
        {k: opened[k] for k in ("severity", "kind", "summary")}
        | {"evidence": {k: opened["evidence"][k] for k in ("rule", "slice", "worst_pairs")}},
        indent=1, ensure_ascii=False,
    ))  # fmt: skip
