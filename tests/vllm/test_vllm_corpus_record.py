"""The corpus recorder on real vLLM: every candidate answer is teacher-forced by its ids.

``quantdrift lab corpus record`` asks the candidate with ``return_token_ids`` and has
the reference score those very ids. Re-tokenizing the answer's text instead split
about one answer cut by ``max_tokens`` in six differently from what was generated, and
those pairs went without ``tf_kl``. Here every shadow pair whose candidate reported
tokens must carry the reference's log-probs, one per candidate token, cut answers
among them.
"""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from quantdrift.lab.corpus import build
from quantdrift.lab.vllm_process import EngineProcess
from quantdrift.lab.vllm_server import engine_caps, find_python

# The engines' start (the session fixture, which this test may be first to ask for) counts.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[2]
# How far one token's forced log-prob may sit from the one reported while sampling, by
# the dtype the engine serves. float32 agrees to rounding. bf16 keeps 8 bits of
# mantissa: on logits of magnitude 10-20 that is 0.05-0.1 per logit, and decoding and
# prefill (forcing) round in different kernels and batch shapes, so single tokens
# differ by up to about 0.2 nats (seen: 0.199 on an AVX-512 host). The mean over an
# answer stays small in both, and the shift test below is what catches misalignment.
PER_TOKEN_BOUND = {"float32": 0.05, "bfloat16": 0.5}
MEAN_BOUND = {"float32": 0.01, "bfloat16": 0.1}


def test_every_recorded_candidate_answer_is_teacher_forced_by_its_ids(
    vllm_engines: dict[str, EngineProcess], tmp_path: Path
) -> None:
    # Short prompts, and answers cut short on purpose: a cut answer is the case that
    # re-tokenization got wrong, and its message stays open when forced.
    every = build.load(ROOT / "corpus" / "prompts.jsonl.gz")  # the committed corpus's
    picked = [p for p in every if p.input_tokens and p.input_tokens < 200][:12]
    assert len(picked) == 12, "the generator's short prompts"
    picked = [replace(p, max_tokens=12 if i % 2 else 160) for i, p in enumerate(picked)]
    prompts = tmp_path / "prompts.jsonl"
    build.save(prompts, picked)
    cand, ref = vllm_engines["candidate"], vllm_engines["reference"]
    shadow = _record(prompts, tmp_path / "pairs", cand.variant, cand.url, ref.url)
    assert len(shadow) == 12
    cut = [p for p in shadow if p["candidate"]["finish_reason"] == "length"]
    assert cut, "no answer was cut by max_tokens: the case under test did not happen"
    for p in shadow:
        tokens = p["candidate"]["tokens"]
        assert tokens, p["pair_id"]
        forced = p["reference_logprobs_on_candidate"]
        assert forced is not None, f"{p['pair_id']} ({p['candidate']['finish_reason']})"
        assert len(forced) == len(tokens), p["pair_id"]
        assert all(lp <= 0.0 for lp in forced)
    # The reference as its own candidate: forcing must give back, token for token, the
    # log-probs it reported while sampling, and an off-by-one alignment could not: the
    # same lists shifted by one token must disagree far more than they do aligned.
    python = find_python()
    assert python is not None
    dtype = engine_caps(python).dtype
    per_token, mean_bound = PER_TOKEN_BOUND[dtype], MEAN_BOUND[dtype]
    selfish = _record(prompts, tmp_path / "self", "self", ref.url, ref.url)
    for p in selfish:
        sampled, forced = p["candidate"]["token_logprobs"], p["reference_logprobs_on_candidate"]
        assert forced is not None and len(forced) == len(sampled), p["pair_id"]
        gaps = [abs(a - b) for a, b in zip(sampled, forced, strict=True)]
        assert max(gaps) < per_token, (p["pair_id"], max(gaps))
        assert sum(gaps) / len(gaps) < mean_bound, (p["pair_id"], gaps)
        if len(sampled) >= 4:
            shifted = [abs(a - b) for a, b in zip(sampled[1:], forced[:-1], strict=True)]
            aligned = sum(gaps[1:]) / len(shifted)
            assert sum(shifted) / len(shifted) > 5 * aligned, (p["pair_id"], gaps, shifted)


def _record(prompts: Path, out: Path, label: str, url: str, ref_url: str) -> list[dict]:
    """Record ``prompts`` with the candidate ``label`` at ``url``: its shadow pairs."""
    done = subprocess.run(
        [sys.executable, "-m", "quantdrift", "lab", "corpus", "record",
         "--prompts", str(prompts), "--out", str(out), "--variants", label,
         "--engine", f"ref={ref_url}", "--engine", f"{label}={url}",
         "--block", "6", "--concurrency", "8"],
        capture_output=True, timeout=800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    pairs = []
    for block in sorted(out.glob("block-*.jsonl.xz")):
        with lzma.open(block, "rt", encoding="utf-8") as f:
            pairs += [json.loads(line) for line in f if line.strip()]
    return [p for p in pairs if p["kind"] == "shadow"]
