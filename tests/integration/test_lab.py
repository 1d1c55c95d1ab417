"""The lab on the real SmolLM2-135M: a recorded pair, the OpenAI-compatible server,
and the pairs shipped in the package. Slow: loads the model twice (here and in the server)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from quantdrift.schemas import PairEvent
from quantdrift.services.pairs import CORPUS_SLICE, read_pairs
from quantdrift.stack import free_port
from quantdrift.stack.ports import stop_popen

pytestmark = pytest.mark.slow

SERVER_START_S = 180.0


@pytest.fixture(scope="module", autouse=True)
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``quantdrift lab serve --precision int8`` in a subprocess. Autouse so it loads
    while the in-process tests run; the tests that call it wait for /health."""
    port = free_port()
    log = tmp_path_factory.mktemp("lab") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "quantdrift", "lab", "serve", "--precision", "int8",
             "--port", str(port), "--threads", "1"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        stop_popen(proc, timeout=15)
        if proc.returncode not in (0, -15):
            sys.stderr.write(log.read_text(errors="replace")[-2000:])


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/health", timeout=2.0)
            if r.status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"lab server at {url} not healthy after {SERVER_START_S:.0f}s")


@pytest.fixture(scope="module")
def lab_model() -> tuple[Any, Any]:
    from quantdrift.lab import model

    return model.load(threads=1)


def test_generate_one_int8_pair(lab_model: tuple[Any, Any]) -> None:
    from quantdrift.lab.generate import LabConfig, run_lab

    model, tokenizer = lab_model
    sink = io.StringIO()
    cfg = LabConfig(variants=["int8"], prompts=1, max_new_tokens=16, decodings=("greedy",))
    stats = run_lab(model, tokenizer, cfg, sink, log=io.StringIO())
    lines = sink.getvalue().splitlines()
    assert stats["pairs"] == {"int8": 1} and len(lines) == 1
    pair = PairEvent.parse(lines[0])
    assert pair.kind == "shadow" and pair.label == "int8" and pair.route == "lab/int8"
    assert pair.pair_id == "lab-shadow-int8-p00-greedy-s0"
    assert pair.candidate.precision == "int8" and pair.reference.precision == "ref-f32"
    assert pair.request.temperature == 0.0 and pair.request.max_tokens == 16
    for side in (pair.candidate, pair.reference):
        n = len(side.tokens or [])
        assert n > 0 and side.text
        assert len(side.entropy or []) == n == len(side.token_logprobs or [])
        assert len(side.top_logprobs or []) == n and all(len(t) <= 5 for t in side.top_logprobs)
        assert side.finish_reason in ("stop", "length")
    tf = pair.reference_logprobs_on_candidate
    assert tf is not None and len(tf) == len(pair.candidate.tokens or [])
    # Where the candidate chose what the reference also chose, teacher forcing reproduces
    # the reference's own log-probs (same prefix, same model).
    if pair.candidate.tokens == pair.reference.tokens:
        assert tf == pytest.approx(pair.reference.token_logprobs, abs=2e-3)


def test_serve_chat_completions(server: str) -> None:
    _wait_healthy(server)
    health = httpx.get(f"{server}/health", timeout=5).json()
    assert health["precision"] == "int8"
    body = {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 8,
        "logprobs": True,
        "top_logprobs": 3,
        "response_format": {"type": "json_object"},
    }
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    assert data["object"] == "chat.completion" and choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    content = choice["logprobs"]["content"]
    assert len(content) == data["usage"]["completion_tokens"] > 0
    assert all(len(c["top_logprobs"]) == 3 and c["logprob"] <= 0 for c in content)

    chunks, done = [], False
    with httpx.stream("POST", f"{server}/v1/chat/completions",
                      json={**body, "stream": True}, timeout=60) as resp:  # fmt: skip
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunks.append(json.loads(line[6:]))
    assert done and chunks[0]["object"] == "chat.completion.chunk"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == choice["message"]["content"]  # greedy: same as non-streaming
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert any(c["choices"][0]["logprobs"] for c in chunks)

    score = httpx.post(
        f"{server}/v1/score",
        json={"messages": body["messages"], "continuation": choice["message"]["content"]},
        timeout=60,
    ).json()
    assert len(score["continuation_logprobs"]) == len(score["tokens"]) > 0

    bad = httpx.post(f"{server}/v1/chat/completions", json={"messages": []}, timeout=10)
    assert bad.status_code == 400 and "error" in bad.json()


def test_shipped_pairs_have_the_labels_the_demo_needs() -> None:
    pairs = read_pairs(None)
    labels = {p.label for p in pairs}
    assert {"int8", "noise"} <= labels and labels & {"int2", "int3"}
    assert all(p.kind == ("noise" if p.label == "noise" else "shadow") for p in pairs)
    assert all(p.reference_logprobs_on_candidate is not None for p in pairs)


def test_the_shipped_corpus_slice_is_the_corpus_s_own_and_mixes_its_traffic(
    tmp_path: Path,
) -> None:
    """The demo's pairs: regenerated from the committed corpus byte for byte, every
    prompt with its noise pair, int8 and int3, and the corpus's mix of languages and
    lengths kept (a slice, not a handful of English prompts)."""
    from quantdrift.cli import main
    from quantdrift.evaluation.corpus import prompt_of

    root = Path(__file__).parents[2]
    out = tmp_path / "slice.jsonl.xz"
    argv = ["lab", "corpus", "slice", "--pairs", str(root / "corpus/pairs"), "--out", str(out)]
    assert main(argv) == 0
    assert out.read_bytes() == (root / "src/quantdrift/data/corpus_slice.jsonl.xz").read_bytes()
    pairs = read_pairs(None, shipped=CORPUS_SLICE)
    by_label: dict[str, set[str]] = {}
    for p in pairs:
        by_label.setdefault(p.label or "", set()).add(prompt_of(p))
    assert set(by_label) == {"noise", "int8", "int3-g64"}
    assert len(by_label["noise"]) == 120
    assert by_label["int8"] == by_label["int3-g64"] == by_label["noise"]
    assert {p.tags.get("language") for p in pairs} >= {"en", "zh", "ja"}
    assert {p.tags.get("length") for p in pairs} >= {"short", "medium", "long"}
    assert main(["lab", "corpus", "slice", "--pairs", str(tmp_path / "none"), "--out",
                 str(out)]) == 2  # fmt: skip


def test_quality_cli_on_shipped_pairs(capsys: pytest.CaptureFixture[str]) -> None:
    from quantdrift.cli import main

    shipped = Path(__file__).parents[2] / "src/quantdrift/data/lab_pairs.jsonl.gz"
    assert main(["lab", "quality", str(shipped), "--json"]) == 0
    rows = {r["variant"]: r for r in json.loads(capsys.readouterr().out)}
    assert "int8" in rows and "noise" in rows
