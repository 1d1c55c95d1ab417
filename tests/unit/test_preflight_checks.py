"""Pure parts of the preflight checks: overlap, scale scan, tensor inspection, parsers."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from quantdrift.preflight import leakage, niah, perplexity, weights
from quantdrift.preflight.checks_files import find_memory_utilization
from quantdrift.preflight.checks_gateway import probe_settings, probes_ok
from quantdrift.preflight.load import Sample, error_bursts, longest_stall, rss_growth

# -- calibration leakage ------------------------------------------------------------


def test_english_overlap_and_near_duplicates() -> None:
    calib = leakage.items(
        [
            "Orders over fifty dollars get ten dollars off with the code SAVE10 at checkout today.",
            "The kettle boils water in four minutes.",
        ]
    )
    evals = leakage.items(
        [
            "Orders over fifty dollars get ten dollars off with the code SAVE10 at checkout today!",
            "How do I return shoes that do not fit?",
        ]
    )
    r = leakage.measure(calib, evals)
    assert [c["eval_index"] for c in r.contaminated] == [0]
    assert [d["eval_index"] for d in r.near_duplicates] == [0]
    ok, why = leakage.leakage_ok(r, leakage.LeakageThresholds())
    assert not ok and "near-duplicates" in why


def test_cjk_uses_character_ngrams() -> None:
    # No spaces in Chinese: word n-grams would see one "word"; character n-grams catch reuse.
    calib = leakage.items(["每个订单只能使用一张优惠券，过期后不能使用。"])
    evals = leakage.items(["请问每个订单只能使用一张优惠券吗？", "长城是中国古代的军事防御工程。"])
    grams = leakage.ngrams(evals.__getitem__(0).text, n_cjk=5)
    assert all(len(g) == 5 and all(len(ch) == 1 for ch in g) for g in grams)
    r = leakage.measure(calib, evals, t=leakage.LeakageThresholds(item_overlap=0.5))
    assert [c["eval_index"] for c in r.contaminated] == [0]
    assert r.near_duplicates == []  # shared phrase, different questions


def test_clean_sets_pass_and_domain_coverage_counts_tags() -> None:
    calib = [
        leakage.TextItem("Backpack with a laptop sleeve.", frozenset({"catalog"})),
        leakage.TextItem("Coupons apply before tax.", frozenset({"coupon-rules"})),
    ]
    evals = leakage.items(["Where is my parcel?"])
    r = leakage.measure(calib, evals, ["catalog", "coupon-rules", "support-qa"])
    assert r.coverage == {"catalog": 1, "coupon-rules": 1, "support-qa": 0}
    ok, why = leakage.leakage_ok(r, leakage.LeakageThresholds())
    assert not ok and why == "domains without calibration data: support-qa"
    r2 = leakage.measure(calib, evals, ["catalog"])
    assert leakage.leakage_ok(r2, leakage.LeakageThresholds())[0]


def test_load_texts_reads_jsonl_records(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "tags": ["support-qa"]})
        + "\n\n"
        + json.dumps({"prompt": "a", "completion": "b", "domain": "catalog"})
        + "\n"
    )
    got = leakage.load_texts(f)
    assert [(i.text, sorted(i.domains)) for i in got] == [
        ("hi", ["support-qa"]),
        ("a\nb", ["catalog"]),
    ]


# -- scale scan ---------------------------------------------------------------------


def _save(path: Path, tensors: dict[str, np.ndarray], config: dict | None = None) -> Path:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


def test_scale_scan_finds_zero_nan_inf_and_out_of_range(tmp_path: Path) -> None:
    good = np.array([1e-3, 0.5, 2.0], dtype=np.float32)
    ckpt = _save(
        tmp_path / "m",
        {
            "layers.0.q_proj.weight": np.ones((4, 4), dtype=np.float32),  # not a scale
            "layers.0.q_proj.weight_scale": good,
            "layers.0.q_proj.input_scale": np.array([0.02], dtype=np.float32),
            "layers.1.k_proj.weight_scale": np.array([0.0, 1.0], dtype=np.float32),
            "layers.1.v_proj.weight_scale": np.array([np.nan, np.inf], dtype=np.float32),
            "layers.2.o_proj.weight_scale": np.array([1e-6, 5e4, -1.0], dtype=np.float32),
        },
    )
    stats = {s.name: s for s in weights.scan_scales(ckpt)}
    assert set(stats) == {
        "layers.0.q_proj.weight_scale",
        "layers.0.q_proj.input_scale",
        "layers.1.k_proj.weight_scale",
        "layers.1.v_proj.weight_scale",
        "layers.2.o_proj.weight_scale",
    }
    assert stats["layers.0.q_proj.weight_scale"].bad == 0
    assert stats["layers.1.k_proj.weight_scale"].zeros == 1
    v = stats["layers.1.v_proj.weight_scale"]
    assert (v.nans, v.infs) == (1, 1)
    o = stats["layers.2.o_proj.weight_scale"]
    assert (o.below, o.above) == (2, 1)  # 1e-6 and a negative scale; 5e4


def test_scale_bounds_are_inclusive() -> None:
    s = weights.scale_stats("x_scale", [1e-4, 1e4])
    assert s.bad == 0 and (s.min, s.max) == (1e-4, 1e4)


# -- tensor inspection --------------------------------------------------------------


def test_gptq_checkpoint_with_protected_head(tmp_path: Path) -> None:
    i32 = np.zeros((8, 64), dtype=np.int32)  # 8 rows x 64 int32 = 4096 4-bit weights
    t = {
        "model.embed_tokens.weight": np.zeros((32, 16), dtype=np.float16),
        "lm_head.weight": np.zeros((32, 16), dtype=np.float16),
        "model.layers.0.mlp.down_proj.weight": np.zeros((16, 16), dtype=np.float16),
        "model.layers.1.mlp.down_proj.qweight": i32,
        "model.layers.1.mlp.down_proj.scales": np.ones((1, 64), dtype=np.float16),
        "model.layers.2.mlp.down_proj.weight": np.zeros((16, 16), dtype=np.float16),
    }
    qc = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "modules_to_not_convert": ["lm_head"],
    }
    insp = weights.inspect(_save(tmp_path / "gptq", t, {"quantization_config": qc}))
    by = {x.name: x for x in insp.tensors}
    assert by["model.layers.1.mlp.down_proj.qweight"].params == 8 * 64 * 8
    assert by["model.layers.1.mlp.down_proj.qweight"].bits == 4
    assert "model.layers.1.mlp.down_proj.scales" not in by  # metadata, not parameters
    r = weights.salient(insp)
    assert r.ok, r.why
    assert r.measured["quant_bits"] == 4 and r.measured["group_size"] == 128
    assert r.measured["modules_not_converted"] == ["lm_head"]
    assert set(r.measured["outlier_layers"]) == {
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.2.mlp.down_proj.weight",
    }
    high = 32 * 16 * 2 + 16 * 16 * 2
    assert r.measured["share_high_precision"] == pytest.approx(high / (high + 4096), abs=1e-4)


def test_quantized_lm_head_and_edge_layer_fail(tmp_path: Path) -> None:
    i32 = np.zeros((4, 4), dtype=np.int32)
    t = {
        "model.embed_tokens.weight": np.zeros((8, 4), dtype=np.float16),
        "lm_head.qweight": i32,
        "model.layers.0.mlp.down_proj.qweight": i32,
        "model.layers.5.mlp.down_proj.weight": np.zeros((4, 4), dtype=np.float16),
    }
    insp = weights.inspect(_save(tmp_path / "awq", t, {"quantization_config": {"w_bit": 4}}))
    r = weights.salient(insp)
    assert not r.ok
    assert r.low == ["lm_head.qweight", "model.layers.0.mlp.down_proj.qweight"]


def test_header_reader_matches_dtypes_without_loading(tmp_path: Path) -> None:
    ckpt = _save(tmp_path / "h", {"a": np.zeros((2, 3), dtype=np.float32)})
    header = weights.safetensors_header(ckpt / "model.safetensors")
    assert header["a"]["dtype"] == "F32" and header["a"]["shape"] == [2, 3]
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 10**12))
    with pytest.raises(Exception, match="not a safetensors file"):
        weights.safetensors_header(bad)


@pytest.mark.slow  # reads the lab model's embeddings from its GGUF file
def test_lab_gguf_embeddings_8bit_blocks_4bit() -> None:
    pytest.importorskip("gguf")
    from quantdrift.lab.model import gguf_location

    try:
        directory, name = gguf_location()
    except Exception as exc:  # the lab extra is not installed
        pytest.skip(str(exc))
    r = weights.salient(weights.inspect(directory / name))
    assert r.measured["embeddings"] == {"token_embd.weight": 8.0}  # Q8_0
    assert r.measured["lm_head"] == "tied to embeddings"
    assert not r.ok and "blk.0.ffn_down.weight" in r.low  # Q4_1 everywhere else
    assert 0.15 < r.measured["share_high_precision"] < 0.3


def test_ggml_bits() -> None:
    assert [weights.ggml_bits(t) for t in ("Q4_K", "Q6_K", "IQ4_NL", "F16")] == [4, 6, 4, 16]


# -- niah, perplexity, memory, probes, load -----------------------------------------


def test_haystack_places_needle_at_depth_and_is_deterministic() -> None:
    n = niah.DEFAULT_NEEDLES[0]
    a = niah.haystack(512, n, 0.1, seed=3)
    assert a == niah.haystack(512, n, 0.1, seed=3)
    body = a.split("\n\n")[1]
    assert body.index(n.fact) < len(body) * 0.25
    deep = niah.haystack(512, n, 0.9, seed=3).split("\n\n")[1]
    assert deep.index(n.fact) > len(deep) * 0.75
    assert 300 < len(body.split()) < 450  # ~0.75 words per token
    with pytest.raises(ValueError):
        niah.haystack(100, n, 1.5)


@pytest.mark.parametrize("needles", [niah.NEEDLES_ZH, niah.NEEDLES_JA])
def test_cjk_haystacks_count_characters_and_ask_in_their_language(needles) -> None:  # type: ignore[no-untyped-def]
    n = needles[1]
    prompt = niah.haystack(1000, n, 0.5, seed=7)
    assert prompt == niah.haystack(1000, n, 0.5, seed=7)
    intro, body, question = prompt.split("\n\n")
    assert (intro, question) == (
        niah.PROMPTS[n.language][0],
        niah.PROMPTS[n.language][1].format(q=n.question),
    )
    assert " " not in body and 0.4 < body.index(n.fact) / len(body) < 0.6
    # 1,000 tokens at the fallback 0.4 characters a token, one filler sentence over at most
    assert 400 <= len(body) - len(n.fact) < 400 + max(map(len, niah.FILLERS[n.language]))
    counted = niah.haystack(1000, n, 0.5, seed=7, chars_per_token=0.9).split("\n\n")[1]
    assert 900 <= len(counted) - len(n.fact) < 900 + max(map(len, niah.FILLERS[n.language]))
    assert niah.hit(f"答案是{n.answer}。", n.answer)


def test_every_language_meets_every_length_with_its_own_needles() -> None:
    needles = [n for lang in niah.LANGUAGES for n in niah.NEEDLES[lang]]
    cs = niah.cases_by_language([256, 1024], [0.1, 0.9], needles, per_cell=2)
    cells = {(c.needle.language, c.length) for c in cs}
    assert cells == {(lang, n) for lang in ("en", "zh", "ja") for n in (256, 1024)}
    assert len(cs) == 3 * 2 * 2 * 2
    assert all(c.needle in niah.NEEDLES[c.needle.language] for c in cs)


def test_niah_vetoes_per_cell_where_the_average_passes() -> None:
    rows = [
        {"language": lang, "length": n, "candidate_hit": not (lang == "ja" and n == 1024 and k),
         "reference_hit": True, "prompt_tokens": n + k}
        for lang in ("en", "zh", "ja") for n in (256, 1024) for k in range(4)
    ]  # fmt: skip
    overall = niah.recall(rows, "candidate_hit")
    assert overall == pytest.approx(21 / 24) and niah.judge(overall, 1.0, 0.75, 0.2)[0]
    cells = niah.by_cell(rows)
    assert len(cells) == 6
    ja = next(c for c in cells if (c["language"], c["length"]) == ("ja", 1024))
    assert (ja["candidate"], ja["reference"], ja["prompt_tokens"]) == (0.25, 1.0, 1026)
    assert niah.judge_cells(cells, 0.75, 0.2) == ["ja at 1,024 tokens: 25% vs reference 100%"]


def test_niah_recall_by_length() -> None:
    rows = [
        {"length": 256, "candidate_hit": True, "reference_hit": True},
        {"length": 1024, "candidate_hit": False, "reference_hit": True},
        {"length": 1024, "candidate_hit": True, "reference_hit": True},
    ]
    assert niah.by_length(rows) == [
        {"length": 256, "candidate": 1.0, "reference": 1.0, "cases": 1},
        {"length": 1024, "candidate": 0.5, "reference": 1.0, "cases": 2},
    ]
    ok, why = niah.judge(niah.recall(rows, "candidate_hit"), 1.0, floor=0.6, tolerance=0.2)
    assert not ok and "reference" in why and "floor" not in why


def test_perplexity_is_token_weighted() -> None:
    lps = [[math.log(0.5)] * 4, [math.log(0.1)]]
    assert perplexity.perplexity(lps) == pytest.approx(
        math.exp(-(4 * math.log(0.5) + math.log(0.1)) / 5)
    )
    assert not perplexity.judge(float("nan"), 10.0, 0.05)[0]


@pytest.mark.parametrize(
    ("text", "suffix", "want"),
    [
        ("vllm serve m --gpu-memory-utilization=0.92", ".sh", 0.92),
        ("model: m\ngpu_memory_utilization: 0.9\n", ".yaml", 0.9),
        ('{"engine": {"gpu-memory-utilization": 0.85}}', ".json", 0.85),
        ("args: ['--gpu-memory-utilization', '0.91']", ".yaml", None),  # split list: not a flag
        ("command: vllm serve m --gpu-memory-utilization 0.91", ".yaml", 0.91),
        ("port: 8000", ".yaml", None),
    ],
)
def test_memory_utilization_parser(text: str, suffix: str, want: float | None) -> None:
    assert find_memory_utilization(text, suffix) == want


def test_probes_need_logprobs_for_the_entropy_probe() -> None:
    from quantdrift.gateway.gateway_config import parse_config

    base = {"precisions": {"int4": ["http://a"], "bf16": ["http://b"]},
            "routes": {"r/int4": {"candidate": "int4", "reference": "bf16"}}}  # fmt: skip
    assert probes_ok(probe_settings(parse_config(base)))[0]
    off = parse_config({**base, "logprobs_on_user_calls": False})
    assert probes_ok(probe_settings(off)) == (False, "off: entropy_probe")
    no_guard = parse_config({**base, "degeneration": {"enabled": False}})
    assert "repetition_probe" in probes_ok(probe_settings(no_guard))[1]


def test_load_stall_bursts_and_rss() -> None:
    ok = [Sample(t * 0.1, 0.05, True, "200") for t in range(100)]
    assert longest_stall(ok) == pytest.approx(0.05)
    stalled = [*ok, Sample(10.0, 12.0, True, "200")]
    assert longest_stall(stalled) == pytest.approx(12.0)
    burst = ok + [Sample(5.0 + i * 0.01, 0.01, False, "502") for i in range(20)]
    assert error_bursts(burst, window_s=2.0, rate=0.2)
    assert error_bursts(ok, window_s=2.0, rate=0.2) == []
    assert rss_growth([100.0] * 8) == 0.0
