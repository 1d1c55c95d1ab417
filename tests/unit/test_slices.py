"""Slice tags: computed on real text through the gateway's planning, bounded against floods."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from quantdrift.detectors.script import estimate_tokens, language_of, length_bucket
from quantdrift.gateway.chain.completions import CompletionPlan, plan_completion
from quantdrift.gateway.chain.planning import Incoming, Plan, plan_request
from quantdrift.gateway.chain.slices import TaskVocabulary, check_tags, request_tags
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.guards.auth import OPEN
from quantdrift.gateway.openai_wire import Accumulator
from quantdrift.gateway.shadow.pairs import build_pair
from quantdrift.integrations.litellm_pairs import PairJoiner, RouteMap, Side
from quantdrift.schemas.pair import ModelOutput, PairEvent

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "prompts.jsonl.gz"
CONFIG = parse_config(
    {
        "precisions": {"int4": ["http://a"], "bf16": ["http://b"]},
        "routes": {"r": {"candidate": "int4", "reference": "bf16"}},
        "shadow_sample_rate": 1.0,
    }
)

# Opening lines of well-known texts, and everyday requests, as users write them.
REAL = [
    ("学而时习之，不亦说乎？有朋自远方来，不亦乐乎？人不知而不愠，不亦君子乎？", "zh"),
    ("北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心。", "zh"),
    ("我的快递三天了还没到，订单号是 SF1234567890，能帮我查一下吗？", "zh"),
    ("吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。", "ja"),
    ("国境の長いトンネルを抜けると雪国であった。夜の底が白くなった。", "ja"),
    ("このPythonの関数が何を返すか教えてください。", "ja"),
    ("대한민국의 수도는 서울특별시이며, 가장 큰 도시이기도 하다.", "ko"),
    (
        "Все счастливые семьи похожи друг на друга, "
        "каждая несчастливая семья несчастлива по-своему.",
        "cyrillic",
    ),
    ("اللغة العربية هي أكثر اللغات السامية تحدثاً، وإحدى أكثر اللغات انتشاراً في العالم.", "arabic"),
    ("It was the best of times, it was the worst of times, it was the age of wisdom.", "en"),
    ("Can you tell me when my refund will be processed? I returned the shoes last week.", "en"),
    (
        "En un lugar de la Mancha, de cuyo nombre no quiero acordarme, no ha mucho tiempo que "
        "vivía un hidalgo de los de lanza en astillero.",
        "es",
    ),
    ("¿Me puedes decir cuándo llega mi pedido? Lo compré el lunes.", "es"),
    ("Longtemps, je me suis couché de bonne heure.", "latin"),
    ("Der Zug nach Berlin fährt um acht Uhr ab, und ich bin nicht pünktlich.", "latin"),
    ("请把下面这句话翻译成英文：Where is the nearest train station and how far is it?", "mixed"),
    ("日本語とEnglishとРусскийが混ざったmessageです", "ja"),  # a few foreign words: still ja
    ("Hola, 我们明天见 tomorrow at the station?", "mixed"),
    ("```python\ndef total(xs):\n    return sum(xs) * 2\n```\n\n请简要解释这个函数的作用。", "zh"),
    ("3 + 4 * 12 = ?", "other"),
]


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **extra}


def planned(body: dict[str, Any], headers: dict[str, str] | None = None, **kw: Any) -> Plan:
    p = plan_request(
        CONFIG,
        body,
        Incoming(headers or {}, OPEN, "req-1", directive_of=lambda _: None, **kw),
        sample_salt="x",
    )
    assert isinstance(p, Plan)
    return p


@pytest.mark.parametrize(("text", "language"), REAL)
def test_language_on_real_text_through_planning(text: str, language: str) -> None:
    assert planned(chat(text)).tags["language"] == language


def completion(body: dict[str, Any], headers: dict[str, str] | None = None) -> CompletionPlan:
    incoming = Incoming(headers or {}, OPEN, "cmpl-1", directive_of=lambda _: None)
    p = plan_completion(CONFIG, body, incoming)
    assert isinstance(p, CompletionPlan)
    return p


@pytest.mark.parametrize(("text", "language"), REAL)
def test_a_text_completion_is_tagged_as_the_same_chat(text: str, language: str) -> None:
    """One path: ``/v1/completions`` computes its tags at plan time as chat does."""
    got = completion({"prompt": text, "temperature": 0})
    assert got.tags == planned(chat(text, temperature=0)).tags | {"length": got.tags["length"]}
    assert got.tags["language"] == language and got.tags["decoding"] == "greedy"


def test_a_text_completions_length_task_and_token_id_prompt() -> None:
    long_text = "This sentence has seven words in it. " * 130  # ~1,270 estimated tokens
    assert completion({"prompt": long_text}).tags["length"] == "long"
    assert completion({"prompt": ["短い", "質問です"]}).tags["language"] == "ja"
    ids = completion({"prompt": [list(range(600)), list(range(600))]}).tags
    assert (ids["length"], ids["language"]) == ("long", "other")  # 1,200 tokens given as ids
    tagged = completion({"prompt": "hi"}, {"x-quantdrift-task": "billing"}).tags
    assert tagged["task"] == "other"  # bounded as chat's: no vocabulary behind the plan
    assert tagged["output"] == "text"


def test_the_language_is_the_users_not_the_system_prompts() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": "注文はどこですか？月曜日に届く予定でした。"},
        ]
    }
    assert planned(body).tags["language"] == "ja"


def test_a_multimodal_message_is_read_by_its_text_parts() -> None:
    content = [
        {"type": "text", "text": "这张图片里有什么？"},
        {"type": "image_url", "image_url": {}},
    ]
    assert planned(chat(content)).tags["language"] == "zh"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("unit", "n", "bucket"),
    [
        ("我", 100, "short"),  # one token per CJK character
        ("我", 200, "medium"),
        ("猫", 1100, "long"),
        ("word ", 80, "short"),  # 1.4 per Latin word
        ("word ", 100, "medium"),
        ("word ", 800, "long"),
    ],
)
def test_length_buckets_count_cjk_characters_as_tokens(unit: str, n: int, bucket: str) -> None:
    assert planned(chat(unit * n)).tags["length"] == bucket


def test_length_counts_every_message_and_stops_once_long() -> None:
    half = "This sentence has seven words in it. " * 60  # ~540 estimated tokens
    one = chat(half)
    two = {"messages": [{"role": "system", "content": half}, {"role": "user", "content": half}]}
    assert (planned(one).tags["length"], planned(two).tags["length"]) == ("medium", "long")
    huge = chat("x " * 2_000_000)  # read no further than MAX_CHARS
    assert planned(huge).tags["length"] == "long"


@pytest.mark.parametrize(
    ("extra", "output", "decoding"),
    [
        ({}, "text", "sampled"),  # unknown decoding counts as sampled
        ({"temperature": 0}, "text", "greedy"),
        ({"temperature": 0.7}, "text", "sampled"),
        ({"response_format": {"type": "json_object"}, "temperature": 0}, "json", "greedy"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}},
                }
            },
            "json",
            "sampled",
        ),
        ({"expected_keys": ["a"]}, "json", "sampled"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool", "sampled"),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"},
            "text",
            "sampled",
        ),
    ],
)
def test_output_kind_and_decoding(extra: dict[str, Any], output: str, decoding: str) -> None:
    tags = planned(chat("Where is my order?", **extra)).tags
    assert (tags["output"], tags["decoding"]) == (output, decoding)


def test_the_task_comes_from_the_header_or_openai_metadata() -> None:
    v = TaskVocabulary()
    by_header = planned(chat("hi"), {"x-quantdrift-task": " Billing "}, admit_task=v.admit)
    by_metadata = planned(chat("hi", metadata={"task": "refunds"}), admit_task=v.admit)
    none = planned(chat("hi"), admit_task=v.admit)
    malformed = planned(chat("hi"), {"x-quantdrift-task": "a/b c"}, admit_task=v.admit)
    assert by_header.tags["task"] == "billing" and by_metadata.tags["task"] == "refunds"
    assert "task" not in none.tags and malformed.tags["task"] == "other"
    # Without a vocabulary (no gateway behind the plan), a declared task stays bounded.
    assert planned(chat("hi"), {"x-quantdrift-task": "billing"}).tags["task"] == "other"


def test_a_flood_of_new_task_values_stays_bounded() -> None:
    capped = TaskVocabulary(cap=8)
    allowed = TaskVocabulary(allowed=["billing", "refunds"])
    seen_capped, seen_allowed = set(), set()
    for i in range(5_000):
        headers = {"x-quantdrift-task": f"task-{i}"}
        seen_capped.add(planned(chat("hi"), headers, admit_task=capped.admit).tags["task"])
        seen_allowed.add(planned(chat("hi"), headers, admit_task=allowed.admit).tags["task"])
    assert len(seen_capped) == 9 and "other" in seen_capped  # the first 8, then "other"
    assert seen_allowed == {"other"} and len(capped) == 8
    # Admitted values stay admitted; allow-listed ones pass.
    assert capped.admit("task-3") == "task-3" and allowed.admit("Refunds") == "refunds"


def test_the_gateway_config_bounds_tasks() -> None:
    cfg = parse_config({**CONFIG.model_dump(mode="json"), "slices": {"tasks": ["billing"]}})
    assert cfg.slices.tasks == ["billing"] and cfg.slices.max_tasks == 32
    with pytest.raises(Exception, match="slices"):
        parse_config({**CONFIG.model_dump(mode="json"), "slices": {"tasks": ["Bad Name"]}})


def test_a_producer_may_set_tags_and_bad_ones_are_refused() -> None:
    tags = request_tags(
        chat("hi"), expects_json=False, given={"task": "summarisation", "length": "long"}
    )
    assert tags["task"] == "summarisation" and tags["length"] == "long"
    for bad in ({"Task": "x"}, {"task": "A B"}, {f"t{i}": "x" for i in range(17)}):
        with pytest.raises(ValueError):
            check_tags(bad)


def test_shadow_pairs_carry_the_plans_tags() -> None:
    body = chat("吾輩は猫である。名前はまだ無い。", temperature=0)
    p = planned(body, {"x-quantdrift-task": "qa"}, admit_task=TaskVocabulary().admit)
    acc = Accumulator("int4")
    acc.add({"choices": [{"index": 0, "delta": {"content": "はい"}, "finish_reason": "stop"}]})
    done = acc.finish()
    pair = build_pair(CONFIG, p, "shadow", (done, done), None, rate=1.0, salt="s",
                      identities={}, ts=0.0)  # fmt: skip
    want = {"language": "ja", "length": "short", "output": "text", "decoding": "greedy"}
    assert pair.tags == {**want, "task": "qa"}
    assert PairEvent.parse(pair.dumps()).tags == pair.tags


def test_litellm_pairs_carry_the_same_tags() -> None:
    route = RouteMap("cs/int4", "cs", "cs-bf16", "int4", "bf16")
    request = chat(
        "¿Dónde está mi pedido? Lo compré el lunes.",
        temperature=0,
        response_format={"type": "json_object"},
    )
    j = PairJoiner([route], timeout_s=5.0, salt="s")
    j.add("j1", Side("cs", ModelOutput(text="{}"), request, True, True, task="orders"), 0.0)
    pair = j.add("j1", Side("cs-bf16", ModelOutput(text="{}"), request, False), 1.0)
    assert pair is not None
    assert pair.tags == {
        "language": "es",
        "length": "short",
        "output": "json",
        "decoding": "greedy",
        "task": "orders",
    }


def test_on_the_traffic_corpus_language_agrees_and_length_mostly_does() -> None:
    """The corpus's tags are the lab's (length by SmolLM2's tokenizer): the estimate is
    checked against them per language (see detectors/script.py for the numbers)."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as lines:
        prompts = [json.loads(line) for line in lines]
    agree: dict[str, list[int]] = {}
    for p in prompts:
        body = {"messages": p["messages"], "temperature": 0.7 if p["decoding"] == "sampled" else 0}
        tags = request_tags(body, expects_json=p["output_kind"] == "json")
        assert tags["language"] == p["language"], p["prompt_id"]
        assert tags["decoding"] == p["decoding"]
        counts = agree.setdefault(p["language"], [0, 0])
        counts[0] += tags["length"] == length_bucket(p["input_tokens"])
        counts[1] += 1
    share = {lang: ok / n for lang, (ok, n) in agree.items()}
    assert share["en"] >= 0.95 and share["es"] >= 0.85
    assert share["zh"] >= 0.7 and share["ja"] >= 0.65  # SmolLM2: ~2 tokens per CJK char


def test_estimates_are_cheap_and_bounded() -> None:
    assert estimate_tokens("猫" * 10) == 10
    assert language_of("a" * 10_000_000) == "latin"  # reads at most MAX_CHARS
