"""The recorded traffic corpus in numbers: what it holds, and what recording it cost.

    python bench/corpus_numbers.py [--corpus corpus/pairs] [--prompts corpus/prompts.jsonl.gz]
                                   [--json]

Counts distinct prompts per task family, language, length bucket and decoding (from the
tags every pair carries), the shadow pairs that carry the reference's teacher-forced
log-probs, the tokens each engine read and wrote (input lengths from the prompts file,
which measured them with the served model's tokenizer; answers by their recorded
tokens). Tokens per second are not here: requests overlap and blocks were recorded on
different hosts, so the recording's own progress lines (``lab corpus record``) give
each run's wall-clock rates.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from quantdrift.lab.corpus import build
from quantdrift.services.pairs import read_pairs

ROOT = Path(__file__).resolve().parent.parent
DIMENSIONS = ("task", "language", "length", "decoding", "output")


def numbers(pairs_dir: Path, prompts_file: Path | None) -> dict[str, Any]:
    pairs = read_pairs(pairs_dir)
    tags: dict[str, dict[str, str]] = {}
    shadow = forced = 0
    tokens_out: Counter[str] = Counter()
    requests: Counter[str] = Counter()
    prompt_of: dict[str, str] = {}
    for p in pairs:
        pid = p.pair_id.rsplit("-", 1)[0] if p.kind == "noise" else None
        if p.kind == "shadow":
            shadow += 1
            forced += p.reference_logprobs_on_candidate is not None
            label = p.label or p.candidate.model
            pid = p.pair_id[: -len(label) - 1]
            sides = [(label, p.candidate)]
        else:
            sides = [("ref", p.candidate), ("ref", p.reference)]
        assert pid is not None
        tags[pid] = dict(p.tags or {})
        for engine, side in sides:
            prompt_of.setdefault(f"{pid}/{engine}/{id(side)}", pid)
            requests[engine] += 1
            tokens_out[engine] += len(side.tokens or [])
    input_tokens: dict[str, int] = {}
    if prompts_file is not None and prompts_file.exists():
        input_tokens = {q.prompt_id: int(q.input_tokens or 0) for q in build.load(prompts_file)}
    per_engine_in: Counter[str] = Counter()
    for key, pid in prompt_of.items():
        per_engine_in[key.split("/")[1]] += input_tokens.get(pid, 0)
    out: dict[str, Any] = {
        "bench": "corpus_numbers",
        "prompts": len(tags),
        "pairs": len(pairs),
        "shadow_pairs": shadow,
        "teacher_forced": forced,
    }
    for dim in DIMENSIONS:
        out[dim] = dict(Counter(t.get(dim, "?") for t in tags.values()).most_common())
    out["engines"] = {
        e: {
            "requests": requests[e],
            "input_tokens": per_engine_in[e],
            "generated_tokens": tokens_out[e],
        }
        for e in sorted(requests)
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "corpus" / "pairs")
    ap.add_argument("--prompts", type=Path, default=ROOT / "corpus" / "prompts.jsonl.gz")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = numbers(args.corpus, args.prompts)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['prompts']} prompts, {result['pairs']} pairs; teacher-forced "
          f"{result['teacher_forced']} of {result['shadow_pairs']} shadow pairs")  # fmt: skip
    for dim in DIMENSIONS:
        print(f"{dim}: " + ", ".join(f"{k} {v}" for k, v in result[dim].items()))
    for e, m in result["engines"].items():
        print(f"{e}: {m['requests']} requests, {m['input_tokens']} input tokens, "
              f"{m['generated_tokens']} generated")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
