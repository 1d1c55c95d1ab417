"""Teacher forcing: the reference's log-prob of each token the candidate wrote.

A pool says how its servers do it (``pools.P.teacher_forcing``):

* ``lab``: ``POST /v1/score`` with ``{messages, continuation}`` (``quantdrift lab
  serve``; vLLM's ``/v1/score`` is a different API);
* ``vllm``: a chat request whose last message is the candidate's answer, with
  ``add_generation_prompt: false``, ``prompt_logprobs`` and ``max_tokens: 1``; the
  reference's own chat template renders it. ``POST /tokenize`` of the same chat
  with ``add_generation_prompt: true`` says where the answer starts;
* ``none``: the pool cannot; a route that asks for it is refused at load time.

**Alignment** (vLLM). An answer that finished (``stop``) carries the end-of-turn
token among its own log-probs; the message is then *closed*
(``continue_final_message: false``), which puts that token right after the
answer. An answer cut by ``max_tokens`` has no such token; its message stays
*open* (``continue_final_message: true``). Either way the reference's
log-probs are the ``n`` positions after the prompt, ``n`` the number of tokens
the candidate reported (what follows, e.g. the template's newline, is clipped).
These must be the *same* tokens: the reference re-tokenizes the answer's text,
which can split it differently from what the candidate generated (and always
will when the two sides have different tokenizers). Then the token lists
disagree, and the pair goes without ``tf_kl`` rather than with a divergence
measured on different tokens: ``Mismatch`` says so and the caller counts it
(``shadow_errors{reason="tf_token_mismatch"}``). The lab's scorer follows the
same rule: a list of a different length gives no ``tf_kl``
(``detectors.entropy.teacher_forced_kl``).

**By token ids** (vLLM, when the candidate's answer carries them). A vLLM candidate
asked with ``return_token_ids: true`` reports its prompt's and its answer's token
ids. Then nothing is re-tokenized: the reference scores exactly those ids
(``POST /v1/completions`` with the ids as the prompt, ``prompt_logprobs: K``,
``max_tokens: 1``), and the alignment trap cannot happen. This needs the two sides to
share a tokenizer, as the builds of one model do; a reply whose entries do not carry
the ids asked for is a counted mismatch, never a divergence measured on other tokens.

**The reference's view** (``top_k``, the gateway's ``top_logprobs``). Besides the log-prob
of the candidate's token, each forced position says what the reference would have
written there: vLLM's ``prompt_logprobs: K`` entries hold its top-K tokens with their
``rank`` and the candidate's own token with its rank among all; the lab's ``/v1/score``
answers ``continuation_top`` and ``continuation_ranks`` when asked with ``top_k``.
``Scored.top`` / ``Scored.ranks`` carry them to the pair, from which the worker finds
the first divergent token (``detectors/divergence.py``). A server that reports no ranks
gives a pair without them; the log-probs stand alone as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from quantdrift.gateway.upstream.client import CALL_ERRORS, PoolClient, Reply, failure_name

TeacherForcing = Literal["vllm", "lab", "none"]

# Outcome reasons (counted as shadow_errors{reason="tf_<reason>"}).
UNSUPPORTED = "unsupported"  # the server has no such API (404/405/400 on the request shape)
MISMATCH = "token_mismatch"  # the re-tokenized answer is not the candidate's token list
FAILED = "error"  # timeout, 5xx, unreadable reply

# A tiny chat for the startup probe: one assistant answer to score.
PROBE_MESSAGES = [{"role": "user", "content": "Say hello."}]
PROBE_ANSWER = "Hello"


@dataclass(frozen=True, slots=True)
class Scored:
    """The reference's log-probs of the candidate's tokens; ``tokens``: how many tokens
    the forced pass read (prompt + answer) when the server said, for the shadow spend."""

    logprobs: list[float]
    tokens: int | None = None
    # Per forced position: the reference's top-k {token: logprob} and the 1-based rank
    # of the candidate's token among the reference's; None when the server gave none.
    top: list[dict[str, float]] | None = None
    ranks: list[int] | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    reason: str
    detail: str


Outcome = Scored | Failed


def align(
    candidate_tokens: Sequence[str],
    start: int,
    prompt_token_ids: Sequence[int],
    prompt_logprobs: Sequence[Mapping[str, Any] | None],
    top_k: int = 1,
) -> Outcome:
    """The reference's log-probs of the candidate's ``n`` tokens, from position ``start``.

    ``prompt_logprobs[i]`` is vLLM's entry for prompt position ``i``: a mapping of
    token id (as a string) to ``{logprob, rank, decoded_token}``, the actual token
    ``prompt_token_ids[i]`` always among them.

    >>> entries = [None, {"7": {"logprob": -0.5, "decoded_token": "Hi"}},
    ...            {"2": {"logprob": -0.1, "decoded_token": "<|im_end|>"}}]
    >>> align(["Hi", "<|im_end|>"], 1, [1, 7, 2], entries)
    Scored(logprobs=[-0.5, -0.1], tokens=None, top=None, ranks=None)
    >>> align(["Hello"], 1, [1, 7, 2], entries).reason
    'token_mismatch'
    """
    n = len(candidate_tokens)
    if n == 0:
        return Failed(MISMATCH, "the candidate reported no tokens")
    if len(prompt_token_ids) != len(prompt_logprobs) or start < 1:
        return Failed(FAILED, "prompt_logprobs do not cover the prompt")
    if start + n > len(prompt_token_ids):
        have = len(prompt_token_ids) - start
        return Failed(MISMATCH, f"candidate has {n} tokens, the reference's answer {have}")
    out: list[float] = []
    for i in range(n):
        tid = prompt_token_ids[start + i]
        entry = (prompt_logprobs[start + i] or {}).get(str(tid))
        if not isinstance(entry, Mapping) or not isinstance(entry.get("logprob"), int | float):
            return Failed(FAILED, f"no log-prob for the token at position {start + i}")
        decoded = entry.get("decoded_token")
        if decoded is not None and decoded != candidate_tokens[i]:
            return Failed(
                MISMATCH,
                f"token {i}: candidate {candidate_tokens[i]!r}, reference {decoded!r}",
            )
        out.append(float(entry["logprob"]))
    return _viewed(
        out, [prompt_logprobs[start + i] for i in range(n)], prompt_token_ids[start:], top_k
    )


def align_ids(
    answer_ids: Sequence[int],
    start: int,
    prompt_logprobs: Sequence[Mapping[str, Any] | None],
    top_k: int = 1,
) -> Outcome:
    """The reference's log-probs of ``answer_ids``, which sit at ``start`` onwards of a
    prompt the reference was given as token ids (so no decoded text is compared).

    >>> entries = [None, {"7": {"logprob": -0.5}}, {"2": {"logprob": -0.1}}]
    >>> align_ids([7, 2], 1, entries).logprobs
    [-0.5, -0.1]
    >>> align_ids([7, 3], 1, entries).reason
    'token_mismatch'
    """
    if not answer_ids:
        return Failed(MISMATCH, "the candidate reported no token ids")
    if start < 1 or start + len(answer_ids) > len(prompt_logprobs):
        return Failed(FAILED, "prompt_logprobs do not cover the answer")
    out: list[float] = []
    for i, tid in enumerate(answer_ids):
        entry = (prompt_logprobs[start + i] or {}).get(str(tid))
        if not isinstance(entry, Mapping):
            return Failed(MISMATCH, f"token {i}: no entry for id {tid}")
        if not isinstance(entry.get("logprob"), int | float):
            return Failed(FAILED, f"no log-prob for the token at position {start + i}")
        out.append(float(entry["logprob"]))
    return _viewed(out, prompt_logprobs[start : start + len(answer_ids)], answer_ids, top_k)


def _viewed(
    logprobs: list[float],
    entries: Sequence[Mapping[str, Any] | None],
    ids: Sequence[int],
    k: int,
) -> Scored:
    """``logprobs`` with the reference's view at each position: its top-``k`` (the
    entries ranked at most ``k``; vLLM adds the actual token to its top-K, with its
    rank, when it is not among them) and the candidate's token's rank; without them
    when an entry carries no ranks.

    >>> e = [{"7": {"logprob": -2.0, "rank": 3, "decoded_token": "a"},
    ...       "4": {"logprob": -0.2, "rank": 1, "decoded_token": "b"}}]
    >>> s = _viewed([-2.0], e, [7], 1)
    >>> s.top, s.ranks
    ([{'b': -0.2}], [3])
    >>> _viewed([-2.0], [{"7": {"logprob": -2.0}}], [7], 1).ranks is None
    True
    """
    top: list[dict[str, float]] = []
    ranks: list[int] = []
    for entry, tid in zip(entries, ids, strict=False):
        found = {t: v for t, v in (entry or {}).items() if isinstance(v, Mapping) and _ranked(v)}
        mine = found.get(str(tid))
        if mine is None:
            return Scored(logprobs)
        ranks.append(max(1, int(mine["rank"])))
        best = sorted((v for v in found.values() if int(v["rank"]) <= k), key=lambda v: v["rank"])
        top.append({str(v.get("decoded_token", "")): float(v["logprob"]) for v in best})
    return Scored(logprobs, top=top, ranks=ranks)


def _ranked(v: Mapping[str, Any]) -> bool:
    return isinstance(v.get("rank"), int) and isinstance(v.get("logprob"), int | float)


async def score_vllm_ids(
    client: PoolClient,
    url: str,
    model: str | None,
    prompt_ids: Sequence[int],
    answer_ids: Sequence[int],
    timeout_s: float,
    top_k: int = 1,
) -> Outcome:
    """Teacher-force the candidate's own token ids on the vLLM server at ``url``; the
    reference's top-``top_k`` at each position comes back with them."""
    top_k = max(1, top_k)
    body: dict[str, Any] = {
        "prompt": [*prompt_ids, *answer_ids],
        "prompt_logprobs": top_k,
        "max_tokens": 1,
        "temperature": 0,
    }
    if model:
        body["model"] = model
    r = await _post(client, url, "/v1/completions", body, timeout_s)
    if isinstance(r, Failed):
        return r
    try:
        entries = r.json()["choices"][0]["prompt_logprobs"]
    except (ValueError, KeyError, IndexError, TypeError):
        return Failed(FAILED, "unreadable reply")
    if not isinstance(entries, list):
        return Failed(UNSUPPORTED, "no prompt_logprobs in the reply")
    # The forced pass read the prompt and the answer: that is its spend.
    found = align_ids(list(answer_ids), len(prompt_ids), entries, top_k)
    return _with_tokens(found, len(prompt_ids) + len(answer_ids))


def _with_tokens(outcome: Outcome, tokens: int) -> Outcome:
    """``outcome`` with the tokens its forced pass read, when it scored."""
    return replace(outcome, tokens=tokens) if isinstance(outcome, Scored) else outcome


def _refused(r: Reply, what: str) -> Failed | None:
    """A reply that is not a 200, as a Failed: the request's shape refused (the server
    has no such API) or any other failure; None for a 200."""
    if r.status in (400, 404, 405, 422):
        return Failed(UNSUPPORTED, f"{what}: HTTP {r.status}: {r.text[:200]}")
    if r.status != 200:
        return Failed(FAILED, f"{what}: HTTP {r.status}")
    return None


async def _post(
    client: PoolClient, url: str, path: str, body: Any, timeout_s: float
) -> Reply | Failed:
    """One scoring call under its deadline: the 200 reply, or why there is none."""
    try:
        async with asyncio.timeout(timeout_s):
            r = await client.post(f"{url}{path}", body)
    except CALL_ERRORS as exc:
        return Failed(FAILED, failure_name(exc))
    return _refused(r, path) or r


def vllm_request(
    messages: Sequence[Mapping[str, Any]],
    answer: str,
    finished: bool,
    model: str | None,
    top_k: int = 1,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``/tokenize`` body, chat body) that teacher-force ``answer`` on a vLLM server."""
    tokenize: dict[str, Any] = {"messages": list(messages), "add_generation_prompt": True}
    chat: dict[str, Any] = {
        "messages": [*messages, {"role": "assistant", "content": answer}],
        "add_generation_prompt": False,
        "continue_final_message": not finished,
        "prompt_logprobs": max(1, top_k),
        "max_tokens": 1,
        "temperature": 0,
        "return_token_ids": True,
    }
    if model:
        tokenize["model"] = model
        chat["model"] = model
    return tokenize, chat


async def _vllm_positions(
    client: PoolClient,
    url: str,
    model: str | None,
    messages: Sequence[Mapping[str, Any]],
    answer: str,
    finished: bool,
    timeout_s: float,
    top_k: int = 1,
) -> tuple[int, list[Any], list[Any]] | Failed:
    """(where the answer starts, prompt token ids, prompt_logprobs) of one forced chat."""
    tokenize, chat = vllm_request(messages, answer, finished, model, top_k)
    try:
        async with asyncio.timeout(timeout_s):
            tok, scored = await asyncio.gather(
                client.post(f"{url}/tokenize", tokenize),
                client.post(f"{url}/v1/chat/completions", chat),
            )
    except CALL_ERRORS as exc:
        return Failed(FAILED, failure_name(exc))
    refused = _refused(tok, "/tokenize") or _refused(scored, "prompt_logprobs")
    if refused is not None:
        return refused
    try:
        start = len(tok.json()["tokens"])
        body = scored.json()
        ids = body.get("prompt_token_ids") or body["choices"][0].get("prompt_token_ids")
        entries = body.get("prompt_logprobs") or body["choices"][0].get("prompt_logprobs")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return Failed(FAILED, "unreadable reply")
    if not isinstance(ids, list) or not isinstance(entries, list):
        return Failed(UNSUPPORTED, "no prompt_token_ids / prompt_logprobs in the reply")
    return start, ids, entries


async def score_vllm(
    client: PoolClient,
    url: str,
    model: str | None,
    messages: Sequence[Mapping[str, Any]],
    answer: str,
    candidate_tokens: Sequence[str],
    finished: bool,
    timeout_s: float,
    top_k: int = 1,
) -> Outcome:
    """Teacher-force one answer on the vLLM server at ``url`` (two calls, one deadline)."""
    top_k = max(1, top_k)
    got = await _vllm_positions(client, url, model, messages, answer, finished, timeout_s, top_k)
    if isinstance(got, Failed):
        return got
    return _with_tokens(align(candidate_tokens, *got, top_k), len(got[1]))


async def probe(
    client: PoolClient, url: str, model: str | None, mode: str, timeout_s: float
) -> Outcome:
    """Can the server at ``url`` teacher-force the way its pool declared? (startup check)"""
    if mode == "vllm":
        got = await _vllm_positions(
            client, url, model, PROBE_MESSAGES, PROBE_ANSWER, False, timeout_s
        )
        if isinstance(got, Failed):
            return got
        start, ids, entries = got
        tail = entries[start:]
        if not tail or len(entries) != len(ids):
            return Failed(UNSUPPORTED, "prompt_logprobs do not cover the forced answer")
        return Scored([float(next(iter(e.values()))["logprob"]) for e in tail if e])
    if mode == "lab":
        return await score_lab(client, url, PROBE_MESSAGES, PROBE_ANSWER, timeout_s)
    return Failed(UNSUPPORTED, "teacher_forcing: none")


async def score_lab(
    client: PoolClient, url: str, messages: Any, answer: str, timeout_s: float, top_k: int = 1
) -> Outcome:
    """``POST /v1/score`` of ``quantdrift lab serve`` (with ``top_k``: the reference's
    top-k and the continuation's ranks too)."""
    body = {"messages": messages, "continuation": answer, "top_k": max(1, top_k)}
    r = await _post(client, url, "/v1/score", body, timeout_s)
    if isinstance(r, Failed):
        return r
    try:
        reply = r.json()
        values, usage = reply.get("continuation_logprobs"), reply.get("usage")
    except (ValueError, AttributeError):
        return Failed(FAILED, "unreadable reply")
    if isinstance(values, list) and all(isinstance(v, int | float) for v in values):
        top, ranks = _lab_view(reply, len(values))
        return Scored([float(v) for v in values], _read_tokens(usage), top, ranks)
    return Failed(UNSUPPORTED, "no continuation_logprobs in the reply")


def _lab_view(
    reply: Mapping[str, Any], n: int
) -> tuple[list[dict[str, float]] | None, list[int] | None]:
    """The lab's ``continuation_top`` / ``continuation_ranks``, when both are well formed
    and as long as the log-probs; else (None, None): a reply without them still scores.

    >>> _lab_view({"continuation_top": [{"a": -0.1}], "continuation_ranks": [2]}, 1)
    ([{'a': -0.1}], [2])
    >>> _lab_view({"continuation_top": [{"a": -0.1}]}, 1)
    (None, None)
    """
    top, ranks = reply.get("continuation_top"), reply.get("continuation_ranks")
    if not (isinstance(top, list) and isinstance(ranks, list) and len(top) == len(ranks) == n):
        return None, None
    try:
        views = [{str(t): float(v) for t, v in d.items()} for d in top]
    except (AttributeError, TypeError, ValueError):
        return None, None
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks):
        return None, None
    return views, [int(r) for r in ranks]


def _read_tokens(usage: Any) -> int | None:
    """Prompt + continuation tokens of a ``/v1/score`` reply's usage, None without it.

    >>> _read_tokens({"prompt_tokens": 12, "continuation_tokens": 5}), _read_tokens(None)
    (17, None)
    """
    if not isinstance(usage, Mapping):
        return None
    counts = [usage.get("prompt_tokens"), usage.get("continuation_tokens")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in counts):
        return None
    return int(counts[0]) + int(counts[1])  # type: ignore[arg-type]
