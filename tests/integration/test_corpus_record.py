"""`quantdrift lab corpus record` killed mid-run resumes with no pair missing or twice.

Real engines: `quantdrift lab serve` for the reference and int8 (the lab server
teacher-forces through its own `/v1/score`, `--teacher-forcing lab`); the vLLM tier
records through the same code with `teacher_forcing: vllm`. The recorder is killed with
SIGKILL, a crash with no chance to tidy up, while its second block is in flight.
"""

from __future__ import annotations

import json
import lzma
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantdrift.lab.corpus import build
from quantdrift.lab.corpus.families import CorpusPrompt
from quantdrift.stack.ports import stop_popen
from support.lab import start_lab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _record(prompts: Path, out: Path, urls: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "quantdrift", "lab", "corpus", "record",
         "--prompts", str(prompts), "--out", str(out), "--variants", "int8",
         "--engine", f"ref={urls['ref']}", "--engine", f"int8={urls['int8']}",
         "--teacher-forcing", "lab", "--block", "2", "--concurrency", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip


def _short_prompts(tmp_path: Path, count: int, n: int) -> tuple[list[CorpusPrompt], Path]:
    """``n`` short prompts with short answers from a generated corpus of ``count``, and
    the file they were saved to: the lab server decodes on one CPU thread."""
    every = tmp_path / "all.jsonl.gz"
    subprocess.run(
        [sys.executable, "-m", "quantdrift", "lab", "corpus", "generate",
         "--seed", "3", "--count", str(count), "--out", str(every)],
        check=True, capture_output=True,
    )  # fmt: skip
    short = [p for p in build.load(every) if p.input_tokens and p.input_tokens < 128]
    short = [p for p in short if p.max_tokens <= 48][:n]
    assert len(short) == n, "the generator's short prompts"
    prompts = tmp_path / "prompts.jsonl"
    build.save(prompts, short)
    return short, prompts


def _ids(path: Path) -> list[str]:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["pair_id"] for line in f if line.strip()]


def test_a_killed_recording_resumes_without_duplicate_or_missing_pairs(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    short, prompts = _short_prompts(tmp_path, 200, 6)
    procs, urls = start_lab({"ref": "ref-f32", "int8": "int8"}, tmp_path)
    out = tmp_path / "pairs"
    try:
        first = _record(prompts, out, urls)
        block0 = out / "block-00000.jsonl.xz"
        deadline = time.monotonic() + 300
        while not block0.exists():
            assert first.poll() is None, first.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no block written in 300 s"
            time.sleep(0.1)
        written = block0.read_bytes()
        os.killpg(first.pid, signal.SIGKILL)  # mid-run: block 1 is in flight
        first.wait(timeout=30)
        # The fault landed in the window that matters: blocks 1 and 2 were not written.
        assert sorted(p.name for p in out.glob("block-*.jsonl.xz")) == ["block-00000.jsonl.xz"]

        second = _record(prompts, out, urls)
        stdout, stderr = second.communicate(timeout=400)
        assert second.returncode == 0, stderr.decode()[-2000:]
        summary = json.loads(stdout)
        assert summary["prompts_this_run"] == 4 and summary["error"] is None
    finally:
        for p in procs:
            stop_popen(p, timeout=10)
    assert block0.read_bytes() == written  # not redone
    ids = [i for b in sorted(out.glob("block-*.jsonl.xz")) for i in _ids(b)]
    expected = {f"{p.prompt_id}-{label}" for p in short for label in ("noise", "int8")}
    assert len(ids) == len(set(ids)) == 12
    assert set(ids) == expected
    with lzma.open(out / "block-00002.jsonl.xz", "rt", encoding="utf-8") as f:
        pair = json.loads(f.readline())
    assert pair["tags"]["language"] in ("en", "es", "zh", "ja")
    assert pair["request"]["task"] == pair["tags"]["task"]


def test_a_recording_that_loses_teacher_forcing_says_why(tmp_path: Path) -> None:
    """The reference pool is told to force the vLLM way, which the lab server does not
    serve: every candidate answer goes without tf_kl, and the run's summary counts why,
    so a long recording cannot lose its teacher forcing without saying so."""
    pytest.importorskip("transformers")
    short, prompts = _short_prompts(tmp_path, 60, 2)
    procs, urls = start_lab({"ref": "ref-f32", "int8": "int8"}, tmp_path)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "quantdrift", "lab", "corpus", "record",
             "--prompts", str(prompts), "--out", str(tmp_path / "pairs"), "--variants", "int8",
             "--engine", f"ref={urls['ref']}", "--engine", f"int8={urls['int8']}",
             "--teacher-forcing", "vllm", "--block", "2"],
            capture_output=True, timeout=400,
        )  # fmt: skip
    finally:
        for p in procs:
            stop_popen(p, timeout=10)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    summary = json.loads(run.stdout)
    answered = summary["pairs_this_run"] - len(short)  # one noise pair per prompt
    assert summary["without_tf"] == answered == 2
    failed = summary["engines"]["ref"]["tf_failed"]
    assert sum(failed.values()) == 2, failed
    assert "tf_failed" in run.stderr.decode()  # the progress line says it too
