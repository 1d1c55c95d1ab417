"""The lab's own prompt set: short Q&A, explanations, summaries, customer service,
JSON extraction with named keys, long-context needle retrieval, and some Chinese.
It is data, not lab code: eval splits the recorded pairs by it (``part_of``)
without importing the lab.

Each prompt keeps what quality scoring needs: ``expected_keys`` for JSON tasks,
``answer`` for needle tasks. The needle fillers are ~300 tokens of plausible
but irrelevant text with one fact hidden in the middle.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    task: str
    expected_keys: tuple[str, ...] | None = None
    answer: str | None = None

    @property
    def expects_json(self) -> bool:
        return self.task == "json"


_FILLER = (
    "The quarterly operations review covered many routine topics. The facilities team "
    "reported that the new badge readers were installed on every floor and that the "
    "cafeteria would extend its opening hours during the winter months. The finance group "
    "reminded everyone that expense reports must be filed within thirty days and that "
    "receipts older than ninety days cannot be reimbursed. The IT department announced a "
    "migration of the internal wiki to a new platform, planned over several weekends to "
    "avoid disruption, and asked teams to archive pages they no longer use. {needle} The "
    "people team shared the results of the engagement survey: most staff were satisfied "
    "with flexible working, while many asked for clearer career paths and more training "
    "budget. The sustainability committee proposed replacing paper cups with reusable "
    "mugs and installing more bicycle racks near the main entrance. Security reminded "
    "staff to lock their screens, to report suspicious emails, and never to share "
    "passwords, even with colleagues. The meeting closed with a short discussion about "
    "the summer party, the parking rules for visitors, and the schedule for the next "
    "review, which will take place in the large conference room on the third floor."
)


def _needle(fact: str, question: str, answer: str) -> Prompt:
    text = (
        "Read the following notes carefully.\n\n"
        + _FILLER.format(needle=fact)
        + f"\n\nQuestion: {question} Answer in one short sentence."
    )
    return Prompt(text, "needle", answer=answer)


_BY_TASK: tuple[Prompt, ...] = (
    # Short Q&A
    Prompt("What is the capital of France?", "qa"),
    Prompt("How many days are there in a leap year?", "qa"),
    Prompt("What gas do plants absorb from the air?", "qa"),
    Prompt("Who wrote the play Romeo and Juliet?", "qa"),
    Prompt("What is 12 multiplied by 7?", "qa"),
    Prompt("What is the largest planet in our solar system?", "qa"),
    # Explanations
    Prompt("Explain in two sentences why the sky is blue.", "explain"),
    Prompt("Explain what a database index is, briefly.", "explain"),
    Prompt("Explain the difference between weather and climate in simple words.", "explain"),
    Prompt("Explain what recursion means in programming.", "explain"),
    Prompt("Why do we need sleep? Answer briefly.", "explain"),
    # Summaries
    Prompt(
        "Summarize in one sentence: The city council voted to build a new park near the "
        "river. Construction starts in spring and will take two years. The park will include "
        "a playground, walking paths and a small lake.",
        "summary",
    ),
    Prompt(
        "Summarize in one sentence: Our team shipped the new checkout page last week. "
        "Conversion went up by four percent, but some users on old phones reported slow "
        "loading, which we will fix in the next release.",
        "summary",
    ),
    Prompt(
        "Summarize briefly: Regular exercise improves heart health, helps control weight, "
        "reduces stress, and improves sleep quality. Experts recommend at least 150 minutes "
        "of moderate activity per week.",
        "summary",
    ),
    # Customer service
    Prompt(
        "You are a customer support agent. A customer writes: 'My order arrived damaged. "
        "What can I do?' Write a short, polite reply.",
        "support",
    ),
    Prompt(
        "You are a customer support agent. A customer asks: 'How do I reset my password?' "
        "Reply in a few short steps.",
        "support",
    ),
    Prompt(
        "You are a customer support agent. A customer writes: 'I was charged twice for my "
        "subscription this month.' Write a short apology and explain the next steps.",
        "support",
    ),
    Prompt(
        "You are a customer support agent for an airline. A customer asks if they can bring "
        "a small dog on board. Reply briefly and politely.",
        "support",
    ),
    # JSON extraction with named keys
    Prompt(
        'Extract the data as JSON with keys "name", "age" and "city". Reply with JSON only.'
        "\nText: Maria Lopez is 34 years old and lives in Madrid.",
        "json",
        expected_keys=("name", "age", "city"),
    ),
    Prompt(
        'Return a JSON object with keys "product", "price" and "currency". Reply with JSON '
        "only.\nText: The wireless mouse costs 25 dollars.",
        "json",
        expected_keys=("product", "price", "currency"),
    ),
    Prompt(
        'Extract as JSON with keys "date", "time" and "place". Reply with JSON only.\nText: '
        "The meeting is on 12 May at 3 pm in room 204.",
        "json",
        expected_keys=("date", "time", "place"),
    ),
    Prompt(
        'Give a JSON object with keys "title" and "author" for this sentence. Reply with '
        "JSON only.\nText: Pride and Prejudice was written by Jane Austen.",
        "json",
        expected_keys=("title", "author"),
    ),
    Prompt(
        'Extract the order as JSON with keys "item", "quantity" and "customer". Reply with '
        "JSON only.\nText: John ordered three blue notebooks.",
        "json",
        expected_keys=("item", "quantity", "customer"),
    ),
    Prompt(
        'Classify the sentiment and reply with JSON only, with keys "sentiment" and '
        '"confidence".\nText: I love this phone, the battery lasts forever!',
        "json",
        expected_keys=("sentiment", "confidence"),
    ),
    Prompt(
        'Reply with a JSON object with keys "country" and "capital" for Japan. JSON only.',
        "json",
        expected_keys=("country", "capital"),
    ),
    Prompt(
        'Extract as JSON with keys "email" and "phone". Reply with JSON only.\nText: Contact '
        "us at help@example.com or call 555-0142.",
        "json",
        expected_keys=("email", "phone"),
    ),
    # Long-context needle retrieval
    _needle(
        "The secret code for the storage room is 7319.",
        "What is the secret code for the storage room?",
        "7319",
    ),
    _needle(
        "The new project manager for the Atlas project is named Priya.",
        "Who is the new project manager for the Atlas project?",
        "Priya",
    ),
    _needle(
        "The company picnic will be held in Lisbon this year.",
        "In which city will the company picnic be held?",
        "Lisbon",
    ),
    _needle(
        "The backup server is painted bright orange.",
        "What color is the backup server?",
        "orange",
    ),
    _needle(
        "The guest speaker next month is a marine biologist named Tomas.",
        "What is the name of the guest speaker next month?",
        "Tomas",
    ),
    _needle(
        "The office plants are watered every Thursday.",
        "On which day are the office plants watered?",
        "Thursday",
    ),
    # Chinese
    Prompt("中国的首都是哪里？", "qa-zh"),
    Prompt("请用一句话解释什么是人工智能。", "explain-zh"),
    Prompt("请简单介绍一下长城。", "explain-zh"),
    Prompt("你是客服。客户说：'我的快递三天还没到。' 请礼貌地回复。", "support-zh"),
    Prompt("请把这句话翻译成英文：今天天气很好。", "translate-zh"),
    Prompt("一年有几个季节？请列出来。", "qa-zh"),
    # More English to reach ~40
    Prompt("Give three tips for writing clear emails.", "explain"),
    Prompt("Write a haiku about autumn leaves.", "creative"),
)


def _interleave(prompts: tuple[Prompt, ...]) -> tuple[Prompt, ...]:
    """Round-robin over task families, so the first N prompts are a representative mix."""
    families: dict[str, list[Prompt]] = {}
    for p in prompts:
        families.setdefault("zh" if p.task.endswith("-zh") else p.task, []).append(p)
    queues = [q for q in families.values() if q]
    out: list[Prompt] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return tuple(out)


PROMPTS: tuple[Prompt, ...] = _interleave(_BY_TASK)


Part = Literal["calibration", "evaluation"]


def _split(prompts: tuple[Prompt, ...]) -> dict[str, Part]:
    """Within each task family, alternate prompts between the two parts, so both parts
    hold every kind of task (JSON, needles, Chinese, ...)."""
    seen: dict[str, int] = {}
    parts: dict[str, Part] = {}
    for p in prompts:
        family = "zh" if p.task.endswith("-zh") else p.task
        k = seen.get(family, 0)
        seen[family] = k + 1
        parts[p.text] = "calibration" if k % 2 == 0 else "evaluation"
    return parts


# Thresholds, floors and blessed baselines are fitted on the calibration part; the
# README's decision figures come from the evaluation part (``quantdrift eval --holdout``).
SPLIT: dict[str, Part] = _split(_BY_TASK)
_BY_HASH: dict[str, Part] = {
    hashlib.sha256(text.encode()).hexdigest()[:32]: part for text, part in SPLIT.items()
}


def part_of(prompt: str | None, prompt_hash: str | None = None) -> Part:
    """The part a request's prompt belongs to: the lab's own split for its prompts, and a
    stable hash split (by the digest's parity) for any other prompt.

    >>> part_of(PROMPTS[0].text) in ("calibration", "evaluation")
    True
    >>> part_of(None, "sha256:00")
    'evaluation'
    """
    if prompt is not None:
        if prompt in SPLIT:
            return SPLIT[prompt]
        prompt_hash = hashlib.sha256(prompt.encode()).hexdigest()[:32]
    if prompt_hash in _BY_HASH:
        return _BY_HASH[prompt_hash]
    digest = hashlib.sha256((prompt_hash or "").encode()).digest()
    return "calibration" if digest[0] % 2 == 0 else "evaluation"
