"""The OpenAI wire format: folding chunks by choice index, trimming, scrubbing, replay."""

from __future__ import annotations

import json

from quantdrift.gateway.openai_wire import (
    Accumulator,
    client_chunk,
    completion_body,
    replay_chunks,
    scrub,
    trim_logprobs,
)


def entry(token: str, k: int = 5) -> dict:
    alts = [{"token": f"{token}{i}", "logprob": -float(i)} for i in range(k)]
    return {"token": token, "logprob": -0.1, "top_logprobs": alts}


def chunk(index: int, delta: dict, finish: str | None = None, lp: list | None = None) -> dict:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    choice["logprobs"] = {"content": lp} if lp else None
    return {"id": "c", "model": "m", "created": 5, "choices": [choice]}


def test_choices_fold_by_index_with_tool_calls_refusal_and_usage() -> None:
    acc = Accumulator("int4")
    acc.add(chunk(1, {"content": "B"}, lp=[entry("B")]))
    acc.add(chunk(0, {"content": "A"}, lp=[entry("A")]))
    acc.add(chunk(2, {"refusal": "no"}))
    acc.add(chunk(0, {"tool_calls": [{"index": 1, "id": "t2", "function": {"name": "g"}}]}))
    acc.add(chunk(0, {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}))
    acc.add(chunk(1, {}, "stop"))
    acc.add({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    c = acc.finish()
    assert [ch.index for ch in c.choices] == [0, 1, 2]
    assert (c.choices[0].text, c.choices[1].text, c.choices[2].refusal) == ("A", "B", "no")
    calls = c.choices[0].tool_calls
    assert len(calls) == 2 and calls[1]["id"] == "t2" and calls[1]["function"]["arguments"] == "{}"
    assert c.completion_tokens == 2 and c.first_token_s is not None


def test_completion_body_trims_top_logprobs_to_what_was_asked() -> None:
    acc = Accumulator("int4")
    acc.add(chunk(0, {"content": "A"}, "stop", [entry("A", 5)]))
    c = acc.finish()
    body = completion_body(c, {}, request_id="r", logprobs=True, top_k=2)
    assert len(body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    bare = completion_body(c, {}, request_id="r", logprobs=False, top_k=0)
    assert bare["choices"][0]["logprobs"] is None


def test_client_chunk_and_trim() -> None:
    raw = {**chunk(0, {"content": "x"}, lp=[entry("x")]), "usage": {"a": 1}}
    out = client_chunk(raw, logprobs=True, top_k=1)
    assert (
        "usage" not in out and len(out["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 1
    )
    assert client_chunk(raw, logprobs=False, top_k=0)["choices"][0]["logprobs"] is None
    assert trim_logprobs(None, True, 3) is None


def test_replay_has_every_choice_and_usage_last() -> None:
    acc = Accumulator("int4")
    for i in (0, 1):
        acc.add(chunk(i, {"content": f'{{"i": {i}}}'}, "stop"))
    acc.add({"choices": [], "usage": {"completion_tokens": 2}})
    frames = replay_chunks(acc.finish(), {}, request_id="r", include_usage=True)
    events = [json.loads(f[6:]) for f in frames[:-1]]
    assert {c["index"] for e in events for c in e["choices"]} == {0, 1}
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {"completion_tokens": 2}
    assert frames[-1] == b"data: [DONE]\n\n"


def test_scrub_removes_urls_and_pool_hosts() -> None:
    text = scrub("upstream http://10.1.2.3:8000/v1/chat failed; retry gpu-a:8000", ["gpu-a:8000"])
    assert "10.1.2.3" not in text and "gpu-a" not in text
