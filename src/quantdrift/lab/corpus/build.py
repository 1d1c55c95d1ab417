"""Draw the whole corpus for a seed: families, languages and sizes mixed like a day's traffic.

Each prompt ``i`` gets its own generator, seeded by the string ``"{seed}:{i}"`` (Python
seeds a ``Random`` from a string through SHA-512, so this does not depend on
``PYTHONHASHSEED``): prompt 17 is the same whether 100 or 5,000 are drawn, and a
recording can be extended without renumbering.

Lengths are measured, not assumed: each prompt's chat is rendered with the model's own
chat template and tokenized by its tokenizer (SmolLM2's, from the GGUF the lab serves);
the ``length`` tag is that count's bucket. A draw that would not fit the engines'
context (``MAX_INPUT_TOKENS``) is drawn again, with the attempt folded into its seed.
A prompt whose text repeats an earlier one is drawn again too: the corpus holds
distinct prompts only.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantdrift.gateway.shadow.pairs import prompt_text
from quantdrift.lab.corpus.families import FAMILIES, CorpusPrompt
from quantdrift.lab.corpus.worlds import LANGUAGES

# The mix of a day's traffic: chat-heavy, with a steady share of structured calls.
FAMILY_WEIGHTS: dict[str, float] = {
    "customer_service": 0.16,
    "json_extraction": 0.11,
    "tool_call": 0.10,
    "passage_qa": 0.09,
    "summarisation": 0.08,
    "translation": 0.07,
    "word_problem": 0.08,
    "code": 0.08,
    "classification": 0.08,
    "multi_turn": 0.08,
    "long_retrieval": 0.07,
}
LANGUAGE_WEIGHTS: dict[str, float] = {"en": 0.4, "es": 0.2, "zh": 0.2, "ja": 0.2}
SIZE_WEIGHTS: dict[str, float] = {"short": 0.42, "medium": 0.42, "long": 0.16}
# long_retrieval exists to be long.
_RETRIEVAL_SIZES: dict[str, float] = {"short": 0.0, "medium": 0.35, "long": 0.65}
# 4k of input plus up to 96 new tokens fits the engines' --max-model-len 4608.
MAX_INPUT_TOKENS = 4000
_MAX_ATTEMPTS = 20

Measure = Callable[[list[dict[str, str]]], int]


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    names = [k for k, v in weights.items() if v > 0]
    return rng.choices(names, [weights[k] for k in names])[0]


def prompt_key(p: CorpusPrompt) -> str:
    """What makes two prompts the same request: the chat and the decoding."""
    text = json.dumps(p.messages, ensure_ascii=False, sort_keys=True) + p.decoding
    return hashlib.sha256(text.encode()).hexdigest()


def draw(seed: int, i: int, attempt: int = 0) -> CorpusPrompt:
    """Prompt ``i`` of the corpus of ``seed`` (before measuring), one attempt."""
    rng = random.Random(f"{seed}:{i}" if attempt == 0 else f"{seed}:{i}:{attempt}")
    family = _pick(rng, FAMILY_WEIGHTS)
    lang = _pick(rng, LANGUAGE_WEIGHTS)
    assert lang in LANGUAGES
    size = _pick(rng, _RETRIEVAL_SIZES if family == "long_retrieval" else SIZE_WEIGHTS)
    p = FAMILIES[family](rng, lang, size)
    return replace(p, prompt_id=f"c{seed}-{i:05d}")


def generate(seed: int, count: int, measure: Measure) -> Iterator[CorpusPrompt]:
    """``count`` distinct prompts of the corpus of ``seed``, each measured."""
    seen: set[str] = set()
    for i in range(count):
        for attempt in range(_MAX_ATTEMPTS):
            p = draw(seed, i, attempt)
            key = prompt_key(p)
            if key in seen:
                continue
            n = measure(p.messages)
            if n > MAX_INPUT_TOKENS:
                continue
            seen.add(key)
            yield replace(p, input_tokens=n)
            break
        else:  # pragma: no cover - the weights make this practically unreachable
            raise RuntimeError(f"prompt {i} of seed {seed}: no distinct draw that fits")


def tokenizer_measure() -> Measure:
    """Token count of a chat as the served model sees it: its chat template, its tokenizer."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # Deferred: transformers (the lab extra) only when prompts are measured.
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from quantdrift.lab.model import gguf_location

    hf_logging.set_verbosity_error()
    directory, name = gguf_location()
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)

    def measure(messages: list[dict[str, str]]) -> int:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return measure


def save(path: Path, prompts: Sequence[CorpusPrompt]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as sink:
        for p in prompts:
            sink.write(json.dumps(p.to_json(), ensure_ascii=False, sort_keys=True) + "\n")


def load(path: Path) -> list[CorpusPrompt]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as source:
        return [CorpusPrompt.from_json(json.loads(line)) for line in source if line.strip()]


def answers(
    prompts: Sequence[CorpusPrompt],
) -> dict[str, tuple[str | None, str | None, str | None]]:
    """By prompt id: its checkable answer and kind (``CorpusPrompt.checkable``, both None
    where there is nothing to check) and its text as a recorded pair carries it in clear,
    so an evaluation can join answers to pairs recorded without them and refuse a
    prompts file of another corpus (``evaluation.answers.join_answers``)."""
    out: dict[str, tuple[str | None, str | None, str | None]] = {}
    for p in prompts:
        expected, kind = p.checkable() or (None, None)
        out[p.prompt_id] = (expected, kind, prompt_text(p.messages))
    return out


def census(prompts: Sequence[CorpusPrompt]) -> dict[str, Any]:
    """The corpus in numbers: prompts per family, language, length bucket, decoding, output."""
    tags = [p.tags() for p in prompts]
    out: dict[str, Any] = {
        "prompts": len(prompts),
        "distinct": len({prompt_key(p) for p in prompts}),
        "input_tokens": sum(p.input_tokens or 0 for p in prompts),
        "with_answer": sum(1 for p in prompts if p.answer is not None),
    }
    for dim in ("task", "language", "length", "decoding", "output"):
        out[dim] = dict(sorted(Counter(t.get(dim, "?") for t in tags).items()))
    return out
