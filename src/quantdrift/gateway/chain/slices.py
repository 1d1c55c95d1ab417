"""A request's slice tags, decided once where it is planned; one function for every producer.

Quantization harm concentrates in slices (long inputs, non-Latin scripts, JSON and
tool calls), so every pair says which slice its request belongs to
(``PairEvent.tags``) and the breaker can judge a route per slice value. The tags are
cheap and deterministic: a few regular expressions over the request body, no
tokenizer, no model (``detectors/script.py``).

=========  ==========================================================================
tag        value
=========  ==========================================================================
language   of the users' messages (a text completion: its prompt): ``en es latin zh ja
           ko cyrillic arabic mixed other``
length     the whole input, estimated in tokens: ``short`` < 128 ≤ ``medium`` < 1024
           ≤ ``long``
output     ``tool`` (tools offered, ``tool_choice`` not ``none``), ``json`` (a JSON
           contract: ``response_format`` or ``expected_keys``), else ``text``
decoding   ``greedy`` when ``temperature`` is 0, else ``sampled`` (unknown is sampled)
task       the caller's: header ``X-Quantdrift-Task``, else OpenAI ``metadata.task``;
           absent when the caller declares none
=========  ==========================================================================

**The task is bounded.** A caller chooses it, so a caller could flood it: a value is
lower-cased and must match ``[a-z0-9][a-z0-9._-]{0,31}`` (else ``other``); with an
allow-list (``slices.tasks`` in the gateway config) every value outside it is
``other``; without one, a ``TaskVocabulary`` keeps the first ``slices.max_tasks``
distinct values it sees and pools every later one into ``other``. The breaker bounds
its slices again per route (a replica's vocabulary is its own).

A producer may set tags itself (``given``): the lab's recorder knows a prompt's task
family and its length as the model's tokenizer counts it. ``given`` wins over what is
computed, and is checked by the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from quantdrift.detectors.script import estimate_tokens, language_of, length_bucket
from quantdrift.schemas.pair import decoding_of

LANGUAGE, LENGTH, OUTPUT, DECODING, TASK = "language", "length", "output", "decoding", "task"
# Every tag this gateway computes for a request: the dimensions a slice-scoped rollback
# may name and still be mapped here (``control/fence.py``).
DIMENSIONS = (LANGUAGE, LENGTH, OUTPUT, DECODING, TASK)
TASK_HEADER = "x-quantdrift-task"
TASK_METADATA = "task"
OTHER = "other"
MAX_TASKS = 32
MAX_TAGS = 16
# A chat template spends a few tokens per message (role markers) and a few per request.
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REQUEST = 3
CHUNK = 2048

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_VALUE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_TASK = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")


def task_value(raw: Any) -> str | None:
    """A declared task as a tag value: lower-cased, ``other`` when malformed, None if absent.

    >>> task_value(" Billing "), task_value("refund/ES"), task_value(""), task_value(None)
    ('billing', 'other', None, None)
    """
    if raw is None:
        return None
    value = str(raw).strip().lower()
    if not value:
        return None
    return value if _TASK.match(value) else OTHER


def declared_task(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The task the caller declared (header first, then ``metadata.task``), unchecked.

    ``headers`` has lower-case keys.

    >>> declared_task({"x-quantdrift-task": "billing"}, {"metadata": {"task": "faq"}})
    'billing'
    >>> declared_task({}, {"metadata": {"task": "faq"}}), declared_task({}, {"metadata": 3})
    ('faq', None)
    """
    if headers.get(TASK_HEADER):
        return headers[TASK_HEADER]
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get(TASK_METADATA), str):
        return str(metadata[TASK_METADATA])
    return None


class TaskVocabulary:
    """The task values one producer lets through: an allow-list, or the first ``cap`` seen.

    Memory and cardinality stay bounded whatever callers send; every value past the
    bound is ``other``.

    >>> v = TaskVocabulary(cap=2)
    >>> [v.admit(t) for t in ("faq", "billing", "refunds", "faq", "Refunds")]
    ['faq', 'billing', 'other', 'faq', 'other']
    >>> TaskVocabulary(allowed=["faq"]).admit("billing")
    'other'
    """

    def __init__(self, allowed: Iterable[str] = (), cap: int = MAX_TASKS) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.allowed = frozenset(allowed)
        self.cap = cap
        self._seen: set[str] = set()

    def admit(self, raw: Any) -> str | None:
        """``raw`` as a bounded tag value (None when the caller declared no task)."""
        value = task_value(raw)
        if value is None or value == OTHER:
            return value
        if self.allowed:
            return value if value in self.allowed else OTHER
        if value in self._seen:
            return value
        if len(self._seen) >= self.cap:
            return OTHER
        self._seen.add(value)
        return value

    def __len__(self) -> int:
        return len(self.allowed) if self.allowed else len(self._seen)


def pool_tasks(raw: Any) -> str | None:
    """Where no vocabulary is given: a declared task is kept as ``other`` only (bounded)."""
    return None if task_value(raw) is None else OTHER


def check_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """``tags`` as given, or ValueError naming the first tag a pair could not carry.

    >>> check_tags({"task": "customer_service"})
    {'task': 'customer_service'}
    >>> check_tags({"Task": "x"})
    Traceback (most recent call last):
    ValueError: tag name 'Task': lower-case letters, digits and _ (at most 32)
    """
    if len(tags) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags, got {len(tags)}")
    for name, value in tags.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"tag name {name!r}: lower-case letters, digits and _ (at most 32)")
        if not isinstance(value, str) or not _VALUE.match(value):
            raise ValueError(
                f"tag {name}={value!r}: lower-case letters, digits and ._- (at most 64)"
            )
    return dict(tags)


def _texts(messages: Any, roles: tuple[str, ...] | None) -> list[str]:
    """The text of each message (multimodal parts: their text), of ``roles`` or of all."""
    out: list[str] = []
    for m in messages if isinstance(messages, list) else ():
        if not isinstance(m, Mapping) or (roles and m.get("role") not in roles):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(
                str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
            )
        if isinstance(content, str) and content:
            out.append(content)
    return out


def input_tokens(messages: Any) -> float:
    """The whole chat's estimated length in tokens; stops counting once it is long.

    Text is read in pieces of ``CHUNK`` characters so a long prompt costs no more than
    the first pieces that make it long.
    """
    return _estimated(_texts(messages, None), TOKENS_PER_MESSAGE, TOKENS_PER_REQUEST)


def prompt_input(prompt: Any) -> tuple[list[str], int]:
    """A text completion's prompt: its strings, and how many tokens it gives as ids
    (OpenAI's ``prompt`` is a string, a list of strings, a list of token ids, or a list
    of such lists).

    >>> prompt_input("hi"), prompt_input(["a", "b"]), prompt_input([[1, 2], [3]])
    ((['hi'], 0), (['a', 'b'], 0), ([], 3))
    """
    if isinstance(prompt, str):
        return [prompt], 0
    texts: list[str] = []
    ids = 0
    for item in prompt if isinstance(prompt, list) else ():
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, int):
            ids += 1
        elif isinstance(item, list):
            ids += len(item)
    return texts, ids


def _estimated(texts: list[str], per_text: float, total: float) -> float:
    """``total`` plus each text's estimated tokens and ``per_text``, until it is long."""
    for text in texts:
        total += per_text
        for at in range(0, len(text), CHUNK):
            total += estimate_tokens(text[at : at + CHUNK])
            if length_bucket(total) == "long":
                return total
    return total


def output_kind(body: Mapping[str, Any], expects_json: bool) -> str:
    """``tool``, ``json`` or ``text`` (see the module docstring).

    >>> output_kind({"tools": [{"type": "function"}]}, False)
    'tool'
    >>> output_kind({"tools": [{"type": "function"}], "tool_choice": "none"}, True)
    'json'
    >>> output_kind({}, False)
    'text'
    """
    tools = body.get("tools") or body.get("functions")
    choice = body.get("tool_choice", body.get("function_call"))
    if isinstance(tools, list) and tools and choice != "none":
        return "tool"
    return "json" if expects_json else "text"


def request_tags(
    body: Mapping[str, Any],
    *,
    expects_json: bool,
    task: str | None = None,
    given: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A request's slice tags (the module docstring's table); ``given`` wins.

    A chat is read from its messages (the users' for the language); a text completion
    (``/v1/completions``: a ``prompt``, no ``messages``) from its prompt, which is the
    whole input and has no chat template. ``task`` is already bounded
    (``TaskVocabulary.admit``).

    >>> request_tags({"messages": [{"role": "user", "content": "你好，请帮我查一下订单。"}],
    ...               "temperature": 0}, expects_json=False, task="support")
    {'language': 'zh', 'length': 'short', 'output': 'text', 'decoding': 'greedy', 'task': 'support'}
    >>> request_tags({"prompt": "注文はどこですか？月曜日に届く予定でした。"}, expects_json=False)
    {'language': 'ja', 'length': 'short', 'output': 'text', 'decoding': 'sampled'}
    """
    if "messages" not in body and "prompt" in body:
        users, ids = prompt_input(body["prompt"])
        tokens = _estimated(users, 0.0, float(ids))
    else:
        messages = body.get("messages")
        users = _texts(messages, ("user",)) or _texts(messages, None)
        tokens = input_tokens(messages)
    tags = {
        LANGUAGE: language_of("\n".join(users)),
        LENGTH: length_bucket(tokens),
        OUTPUT: output_kind(body, expects_json),
        DECODING: decoding_of(body.get("temperature")),
    }
    if task is not None:
        tags[TASK] = task
    if given:
        tags.update(check_tags(given))
    return tags
