"""The alert points at the token where the candidate went wrong, as on-call receives it.

The openai SDK -> ``quantdrift gateway`` (its example config, the route teacher-forced)
-> scripted upstreams; a real worker (the static scorer tier), the embedded stack and a
policy that judges slices by language and rolls back only the slice that broke.

The candidate (int4) stutters on Chinese prompts only: "巴黎 是 法国 的 首都 首都 首都 …".
The scripted reference, asked by the gateway to teacher-force each candidate answer
(``/v1/score`` with ``top_k``), would have written every token up to the first
repetition, and ranks that one 7th (log-prob -6): so the divergence point is known,
position 5, token "首都 ", and the reference preferred "。". English answers are the
reference's own first choice at every token.

What is checked is what the worker's alert says: it names the slice, every worst pair it
carries is of that slice (not the route's), each with its prompt's salted hash (the route
sends no clear prompts), and its first divergent token at the known position with the
candidate's rank and the reference's preferred token; the line on-call reads says so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quantdrift.alerts import format_alert, slack_payload
from quantdrift.alerts.sinks import AlertGroup
from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess
from quantdrift.detectors.script import language_of
from quantdrift.schemas import AlertEvent
from quantdrift.stack import EmbeddedStack
from support.e2e import example_config, scripted_world, start_gateway
from support.guard import records_for, until_seen
from support.scripted_llm import PREFERRED, ScriptedLLM, words_of

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROUTE = "cs-agent/int4"  # the example config's route
SALT = "divergence-e2e-sample-salt-0123456789"
EN = "The capital of France is Paris , a city on the Seine ."
ZH = "巴黎 是 法国 的 首都 。"
ZH_STUTTER = "巴黎 是 法国 的 首都 首都 首都 首都 首都 首都 首都 。"
DIVERGES_AT = 5  # the first repeated "首都 "
POLICY = {
    "default": {
        "min_pairs": 5,
        "slice_dimensions": ["language"],
        "slice_min_pairs": 5,
        "rollback_scope": "slice",
        "relies_on": ["hard", "outcomes"],
    }
}


def chinese(body: dict[str, Any]) -> bool:
    return language_of(str(body["messages"][-1]["content"])) == "zh"


def reference_forcing(tokens: list[str]) -> list[tuple[float, int]]:
    """The reference would write each token itself, except a repeated one: rank 7."""
    return [(-6.0, 7) if i and tok == tokens[i - 1] else (-0.1, 1) for i, tok in enumerate(tokens)]


@pytest.fixture
def world(
    stack: EmbeddedStack, tmp_path: Path
) -> Iterator[tuple[Settings, WorkerProcess, dict[str, str], ScriptedLLM]]:
    def script(llm: ScriptedLLM) -> None:
        llm.texts.update({"int4": EN, "bf16": EN})
        llm.answer["int4"] = lambda body: ZH_STUTTER if chinese(body) else None
        llm.answer["bf16"] = lambda body: ZH if chinese(body) else None
        llm.forced["bf16"] = reference_forcing

    with scripted_world(stack, tmp_path, POLICY, script) as world:
        yield world


def test_the_alert_names_the_slice_and_the_first_divergent_token(
    world: Any, tmp_path: Path
) -> None:
    settings, worker, env, llm = world
    config = example_config(llm, SALT, noise_sample_rate=0.0, noise_fill={"max_rate": 0.0})
    config["routes"][ROUTE]["teacher_forced"] = True
    config["pools"]["int4"]["logprobs"] = True  # the candidate's tokens, to force
    gw = start_gateway(config, env, tmp_path, "gateway")
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    asked = 0
    try:
        while True:
            for prompt in ("What is the capital of France?", "法国的首都是哪里？") * 2:
                asked += 1
                client.chat.completions.create(
                    model=ROUTE,
                    messages=[{"role": "user", "content": f"{prompt} ({asked})"}],
                    temperature=0.0,
                    max_tokens=64,
                )
            state = asyncio.run(until_seen(settings, ROUTE, asked, worker, timeout=60))
            if state.held:
                break
            assert asked < 80, "no slice rollback after 40 stuttered Chinese answers"
    finally:
        gw.stop()
    assert list(state.held) == ["language=zh"], state
    # Every forced pass but the gateway's startup probe asked for the reference's top-k.
    forced = [b for t, b in llm.calls if t == "bf16/score" and b["continuation"] != "Hello"]
    assert forced and all(b["top_k"] == 5 for b in forced)  # the default top_logprobs

    records = asyncio.run(
        records_for(settings.kafka.bootstrap_servers, settings.kafka.topics.alerts, ROUTE)
    )
    alert = AlertEvent.parse(records[0].value)
    assert alert.kind == "breaker.open" and "[slice language=zh]" in alert.summary
    worst = alert.evidence["worst_pairs"]
    assert worst, alert.evidence
    stutter = words_of(ZH_STUTTER)
    for w in worst:
        assert w["tags"]["language"] == "zh", w  # the slice's own pairs, not the route's
        assert "prompt" not in w and len(w["prompt_hash"]) >= 16  # no clear prompts here
        found = w["first_divergent_token"]
        assert (found["position"], found["of"]) == (DIVERGES_AT, len(stutter)), found
        assert found["token"] == stutter[DIVERGES_AT] == "首都 "
        assert found["rank"] == 7 and found["reference_logprob"] == -6.0
        assert next(iter(found["preferred"])) == PREFERRED
        assert found["context"] is None  # the answer's text travels with clear prompts only
    line = format_alert(alert).plain
    assert f"token {DIVERGES_AT}/{len(stutter)} '首都 ': reference rank 7" in line
    assert f"it preferred '{PREFERRED}'" in line
    slack = slack_payload(AlertGroup(ROUTE, (alert,)))["text"]
    listed = slack.split("\nworst pairs:")[1].split("\n• ")[1:]
    assert listed and all("language=zh" in p and "reference rank 7" in p for p in listed), slack
    print("\non-call's alert (alerts tail):\n" + line + "\n\nSlack:\n" + slack)
    print("\nits first worst pair:\n" + json.dumps(worst[0], indent=1, ensure_ascii=False))
