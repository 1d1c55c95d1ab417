"""Teacher forcing on vLLM: request shape and token alignment (pure functions).

The real-engine side is tests/vllm/; these pin the alignment rule on entries
shaped like vLLM's ``prompt_logprobs``.
"""

from __future__ import annotations

import pytest
import torch

from quantdrift.errors import ConfigError
from quantdrift.gateway.gateway_config import parse_config
from quantdrift.gateway.openai_wire import Accumulator
from quantdrift.gateway.upstream.teacher_forcing import (
    MISMATCH,
    Failed,
    Scored,
    align,
    align_ids,
    vllm_request,
)
from quantdrift.lab.export import dequantize_gptq, gptq_linear, rtn_symmetric


def entries(ids: list[int], tokens: list[str], logprobs: list[float]) -> list[dict | None]:
    out: list[dict | None] = [None]
    for tid, tok, lp in zip(ids[1:], tokens[1:], logprobs[1:], strict=True):
        out.append({str(tid): {"logprob": lp, "rank": 1, "decoded_token": tok}})
    return out


IDS = [1, 10, 11, 12, 13, 2, 198]  # prompt (2 tokens) + "A", "B", "C" + <|im_end|> + "\n"
TOKS = ["<s>", "user", "A", "B", "C", "<|im_end|>", "\n"]
LPS = [0.0, -1.0, -0.1, -0.2, -0.3, -0.4, -0.5]


def test_a_finished_answer_aligns_with_its_end_of_turn_token() -> None:
    got = align(["A", "B", "C", "<|im_end|>"], 2, IDS, entries(IDS, TOKS, LPS))
    assert isinstance(got, Scored)
    assert got.logprobs == [-0.1, -0.2, -0.3, -0.4]  # the template's newline is clipped
    assert got.ranks == [1, 1, 1, 1] and got.top == [{"A": -0.1}, {"B": -0.2}, {"C": -0.3},
                                                    {"<|im_end|>": -0.4}]  # fmt: skip


def test_a_cut_answer_aligns_without_it() -> None:
    got = align(["A", "B", "C"], 2, IDS, entries(IDS, TOKS, LPS))
    assert isinstance(got, Scored) and got.logprobs == [-0.1, -0.2, -0.3]


def test_a_retokenized_answer_that_differs_is_a_counted_mismatch() -> None:
    got = align(["A", "BC", "<|im_end|>"], 2, IDS, entries(IDS, TOKS, LPS))
    assert isinstance(got, Failed) and got.reason == MISMATCH and "'BC'" in got.detail
    longer = align(["A", "B", "C", "x", "y", "z"], 2, IDS, entries(IDS, TOKS, LPS))
    assert isinstance(longer, Failed) and longer.reason == MISMATCH


def test_finished_answers_close_the_message_and_cut_ones_keep_it_open() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    tok, chat = vllm_request(msgs, "Hello", finished=True, model="ref-f32")
    assert tok == {"messages": msgs, "add_generation_prompt": True, "model": "ref-f32"}
    assert chat["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert chat["add_generation_prompt"] is False and chat["continue_final_message"] is False
    assert chat["prompt_logprobs"] >= 1 and chat["max_tokens"] == 1
    assert vllm_request(msgs, "Hel", finished=False, model=None)[1]["continue_final_message"]


def test_a_teacher_forced_route_on_a_pool_that_cannot_is_refused() -> None:
    config = {
        "precisions": {"int4": ["http://a"], "bf16": ["http://b"]},
        "pools": {"bf16": {"teacher_forcing": "none"}},
        "routes": {"r": {"candidate": "int4", "reference": "bf16", "teacher_forced": True}},
    }
    with pytest.raises(ConfigError, match="teacher_forcing: none"):
        parse_config(config)
    config["pools"] = {"bf16": {"teacher_forcing": "vllm"}}
    assert parse_config(config).pool("bf16").teacher_forcing == "vllm"
    config["pools"] = {"bf16": {"teacher_forcing": "sglang"}}
    with pytest.raises(ConfigError, match="teacher_forcing"):
        parse_config(config)


def test_gptq_packing_round_trips_the_symmetric_rtn_grid() -> None:
    torch.manual_seed(0)
    w = torch.randn(192, 576) * 0.05
    t = gptq_linear(w, 4, 64)
    assert t["qweight"].shape == (72, 192) and t["qzeros"].shape == (9, 24)
    assert t["scales"].shape == (9, 192) and t["scales"].dtype == torch.float16
    q, scale = rtn_symmetric(w, 4, 64)
    grid = ((q - 8).float().reshape(192, 9, 64) * scale.unsqueeze(-1)).reshape(192, 576)
    assert torch.equal(dequantize_gptq(t, 4, 64), grid)
    assert (grid - w).abs().max() <= scale.max()  # within one step of the float weight
    assert int(t["qzeros"][0, 0]) & 0xFFFFFFFF == 0x77777777  # v1: zero point 8 stored as 7


async def test_an_engine_change_under_a_pool_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from quantdrift.gateway.shadow.runner import ShadowRunner
    from quantdrift.gateway.upstream.pools import Upstreams
    from quantdrift.schemas.pair import EngineInfo

    config = parse_config(
        {
            "precisions": {"int4": ["http://a"], "bf16": ["http://b"]},
            "routes": {"r": {"candidate": "int4", "reference": "bf16"}},
        }
    )
    upstreams = Upstreams(config, shadow=True)
    runner = ShadowRunner(config, upstreams, None, lambda _: None, prompt_salt="s")
    old = EngineInfo(engine="vllm", version="0.32.0", model="int4-g64-gptq")
    runner.probe.identified("int4", old)
    runner.probe.identified("int4", old)
    assert runner.probe.engine_changes == {}
    with caplog.at_level("WARNING", logger="quantdrift.gateway.shadow.runner"):
        runner.probe.identified("int4", old.model_copy(update={"version": "0.33.0"}))
    assert runner.probe.engine_changes == {"int4": 1}
    assert "0.33.0" in caplog.text and "0.32.0" in caplog.text
    await upstreams.aclose()


def test_token_ids_score_the_candidates_own_tokens_with_no_decoding() -> None:
    # The reference was given the ids themselves: positions 2.. hold ids 11, 12, 13, 2.
    got = align_ids([11, 12, 13, 2], 2, entries(IDS, TOKS, LPS))
    assert isinstance(got, Scored) and got.logprobs == [-0.1, -0.2, -0.3, -0.4]
    wrong = align_ids([11, 99], 2, entries(IDS, TOKS, LPS))
    assert isinstance(wrong, Failed) and wrong.reason == MISMATCH and "99" in wrong.detail
    assert isinstance(align_ids([11] * 9, 2, entries(IDS, TOKS, LPS)), Failed)
    assert isinstance(align_ids([], 2, entries(IDS, TOKS, LPS)), Failed)


def test_a_streamed_answer_keeps_its_token_ids_through_the_shadow_copy() -> None:
    acc = Accumulator("int8")
    acc.add({"id": "c", "prompt_token_ids": [1, 10], "choices": [{"index": 0, "delta": {}}]})
    acc.add({"choices": [{"index": 0, "delta": {"content": "A"}, "token_ids": [11]}]})
    acc.add({"choices": [{"index": 0, "delta": {"content": "B"}, "token_ids": [12]}]})
    acc.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [2]}]})
    done = acc.finish().stripped(5)
    assert done.prompt_token_ids == [1, 10] and done.choice(0).token_ids == [11, 12, 2]
    # A server that does not report ids leaves both empty: the text path is used.
    plain = Accumulator("bf16")
    plain.add({"choices": [{"index": 0, "delta": {"content": "A"}, "token_ids": ["x"]}]})
    assert plain.finish().prompt_token_ids is None and plain.completion.choice(0).token_ids == []


def test_a_pool_that_reports_ids_is_asked_for_them_and_users_never_see_them() -> None:
    from quantdrift.gateway.openai_wire import client_chunk
    from quantdrift.gateway.upstream.pools import Upstreams

    config = parse_config(
        {
            "precisions": {"int4": ["http://a"], "bf16": ["http://b"]},
            "pools": {"int4": {"token_ids": True}, "bf16": {"teacher_forcing": "vllm"}},
            "routes": {"r": {"candidate": "int4", "reference": "bf16", "teacher_forced": True}},
        }
    )
    pools = Upstreams(config, shadow=True)
    body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    assert pools["int4"].shape(body)["return_token_ids"] is True
    assert "return_token_ids" not in pools["int4"].shape(body, chat=False)  # text completions
    assert "return_token_ids" not in pools["int4"].shape({**body, "logprobs": False})
    assert "return_token_ids" not in pools["bf16"].shape(body)
    chunk = {
        "id": "c",
        "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "delta": {"content": "A"}, "token_ids": [11], "logprobs": None}],
    }
    out = client_chunk(chunk, logprobs=False, top_k=0)
    assert "prompt_token_ids" not in out and "token_ids" not in out["choices"][0]
    assert out["choices"][0]["delta"] == {"content": "A"}


def test_the_references_top_k_and_the_candidates_rank_come_with_the_log_probs() -> None:
    # vLLM's prompt_logprobs: 2 entry: the reference's top-2, plus the actual token with
    # its rank when it is not among them (position 3 below: id 13 at rank 6).
    top2 = [
        None,
        None,
        {"11": {"logprob": -0.1, "rank": 1, "decoded_token": "A"},
         "50": {"logprob": -2.5, "rank": 2, "decoded_token": "Z"}},
        {"60": {"logprob": -0.3, "rank": 1, "decoded_token": "Q"},
         "12": {"logprob": -1.6, "rank": 2, "decoded_token": "B"}},
        {"70": {"logprob": -0.05, "rank": 1, "decoded_token": " Paris"},
         "71": {"logprob": -3.1, "rank": 2, "decoded_token": " France"},
         "13": {"logprob": -7.5, "rank": 6, "decoded_token": " Lyon"}},
    ]  # fmt: skip
    got = align_ids([11, 12, 13], 2, top2, top_k=2)
    assert isinstance(got, Scored)
    assert got.logprobs == [-0.1, -1.6, -7.5] and got.ranks == [1, 2, 6]
    assert got.top == [{"A": -0.1, "Z": -2.5}, {"Q": -0.3, "B": -1.6},
                       {" Paris": -0.05, " France": -3.1}]  # fmt: skip
    # Entries without ranks (an older server) still score, without the view.
    bare = align_ids([11], 2, [None, None, {"11": {"logprob": -0.1}}], top_k=2)
    assert isinstance(bare, Scored) and bare.logprobs == [-0.1] and bare.ranks is None
    _, chat = vllm_request([{"role": "user", "content": "hi"}], "A", True, None, top_k=5)
    assert chat["prompt_logprobs"] == 5
