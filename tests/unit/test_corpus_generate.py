"""The traffic corpus's generator: deterministic, distinct, covering, measured for real.

The counts here are made apart from the generator: the token count by the model's own
tokenizer, through its chat template, and every tag re-derived from the prompt's text.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from quantdrift.lab.corpus import build
from quantdrift.lab.corpus.families import FAMILIES, length_bucket

# The measure is SmolLM2's own tokenizer, loaded from the model's GGUF file.
pytestmark = pytest.mark.slow

N = 600


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from quantdrift.lab.model import gguf_location

    directory, name = gguf_location()
    return AutoTokenizer.from_pretrained(directory, gguf_file=name)


@pytest.fixture(scope="module")
def measure():  # type: ignore[no-untyped-def]
    return build.tokenizer_measure()


@pytest.fixture(scope="module")
def prompts(measure):  # type: ignore[no-untyped-def]
    return list(build.generate(7, N, measure))


def test_same_seed_same_corpus_and_prompt_i_does_not_depend_on_count(prompts, measure) -> None:  # type: ignore[no-untyped-def]
    again = list(build.generate(7, 50, measure))
    assert [p.to_json() for p in again] == [p.to_json() for p in prompts[:50]]
    other = list(build.generate(8, 50, measure))
    assert sum(a.messages == b.messages for a, b in zip(again, other, strict=True)) == 0


def test_every_prompt_is_distinct(prompts) -> None:  # type: ignore[no-untyped-def]
    texts = {json.dumps(p.messages, ensure_ascii=False) + p.decoding for p in prompts}
    assert len(texts) == N
    assert len({p.prompt_id for p in prompts}) == N


def test_lengths_are_the_tokenizers_count_and_buckets_cover(prompts, tokenizer) -> None:  # type: ignore[no-untyped-def]
    buckets: Counter[str] = Counter()
    for p in prompts[:200]:
        text = tokenizer.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert p.input_tokens == n
        assert p.tags()["length"] == length_bucket(n)
    for p in prompts:
        assert p.input_tokens is not None and p.input_tokens <= build.MAX_INPUT_TOKENS
        buckets[length_bucket(p.input_tokens)] += 1
    assert set(buckets) == {"short", "medium", "long"}
    # The floor: at least 10 % of the prompts are 1k-4k tokens.
    assert buckets["long"] / N >= 0.10, buckets


_SCRIPT = {
    "zh": re.compile(r"[\u4e00-\u9fff]"),
    "ja": re.compile(r"[\u3040-\u30ff]"),  # kana: what tells Japanese from Chinese
}
_SPANISH_WORDS = re.compile(r"\b(el|la|los|las|de|que|qué|en|por|con|un|una|solo)\b")


def test_tags_cover_families_languages_and_say_what_the_text_is(prompts) -> None:  # type: ignore[no-untyped-def]
    tags = [p.tags() for p in prompts]
    assert {t["task"] for t in tags} == set(FAMILIES)
    assert {t["language"] for t in tags} == {"en", "es", "zh", "ja"}
    assert {t["decoding"] for t in tags} == {"greedy", "sampled"}
    assert {"text", "json", "number"} <= {t["output"] for t in tags}
    for p in prompts:
        text = " ".join(m["content"] for m in p.messages)
        lang = p.language
        if lang in _SCRIPT:
            assert _SCRIPT[lang].search(text), (p.prompt_id, lang)
        if lang == "zh":
            assert not _SCRIPT["ja"].search(text), p.prompt_id
        if lang == "es":
            assert _SPANISH_WORDS.search(text), p.prompt_id
        if lang in ("en", "es"):
            assert not _SCRIPT["zh"].search(text) and not _SCRIPT["ja"].search(text)


def test_decoding_follows_the_task_and_checkable_answers_are_right(prompts) -> None:  # type: ignore[no-untyped-def]
    for p in prompts:
        if p.output_kind == "json":
            assert p.decoding == "greedy" and p.temperature == 0.0
            assert p.json_schema is not None and p.expected_keys
            assert set(json.loads(p.answer or "{}")) == set(p.expected_keys)
        if p.family in ("customer_service", "summarisation", "multi_turn", "translation"):
            assert p.decoding == "sampled" and p.temperature == 0.7
        if p.output_kind == "number" and p.family == "word_problem":
            numbers = [int(x) for x in re.findall(r"\d+", p.messages[-1]["content"])]
            assert p.answer is not None and p.answer.lstrip("-").isdigit()
            assert numbers  # the problem states its numbers
        if p.family == "long_retrieval":
            body = p.messages[0]["content"]
            ident = re.findall(r"E\d{5}", body)[-1]  # the employee asked about
            row = next(line for line in body.splitlines() if line.startswith(ident))
            assert row.split(" | ")[3] == p.answer


def test_customer_service_total_follows_the_shops_rules() -> None:
    from quantdrift.lab.corpus import worlds as w

    shop = w.Shop("S", "en", (), (), shipping_fee=10, free_shipping_over=100, return_days=30)
    kettle = w.Product("SKU-1", "k", "kitchen", 30, 5)
    tent = w.Product("SKU-2", "t", "outdoor", 50, 5)
    ten_off_kitchen = w.Coupon("SAVE10", 10, 50, "kitchen")
    # 2 kettles (60) + 1 tent (50) = 110 >= 50: 10 % of 60 off -> 104, free shipping.
    assert w.order_total(shop, [(kettle, 2), (tent, 1)], ten_off_kitchen) == 104
    # 1 kettle = 30 < 50: no discount, shipping added.
    assert w.order_total(shop, [(kettle, 1)], ten_off_kitchen) == 40


def test_save_and_load_round_trip(tmp_path, prompts) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "p.jsonl.gz"
    build.save(path, prompts[:20])
    assert [p.to_json() for p in build.load(path)] == [p.to_json() for p in prompts[:20]]
