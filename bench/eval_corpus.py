"""The decision table on the recorded traffic corpus: no replay, calibration drawn apart.

    python bench/eval_corpus.py [--corpus corpus/pairs] [--prompts corpus/prompts.jsonl.gz]
                                [--draws 200] [--sizes 100,300,1000]
                                [--modes full,no-teacher-forcing,none] [--policy FILE] [--json]
                                [--write docs/deciding.md]

The corpus is ``quantdrift lab corpus record``'s (``corpus/pairs``): for every prompt
the bf16 reference twice (the noise pair) and each candidate (int8, the GPTQ int4
checkpoint, int3) once against it, with vLLM's teacher-forced log-probs. Prompts are
split once into a calibration pool and an evaluation pool; for every calibration size
and mode, ``--draws`` calibrations are drawn from the pool (each judging a stream of its
own), and the streams draw each evaluation prompt at most once
(:mod:`quantdrift.evaluation.corpus`, ``quantdrift eval --no-replay``).

Scenarios: the corpus's own traffic mix; two mix shifts (a task x3, a language x3);
int3 confined to one language, and to long inputs, at 10 % of traffic; and, per tag
value, a route that carries only that slice (``--slices``). Every row has the
information limit measured on the same pairs.

Correctness: a pair recorded without its prompt's checkable answer takes it from the
prompts file (``quantdrift lab corpus build``, joined by prompt id; a prompt that does
not match refuses the run), so the outcome test judges who got a checkable task right
on every block. The table under the decisions gives, per answer kind, how many
evaluation prompts are checkable and the share each side answered right.

Prints one JSON document (``--json``) with ``distinct_eval_prompts``,
``calibration_prompts`` and ``rows`` (scenario, variant, calibration_prompts, mode,
false_rollbacks, healthy_pairs, streams, delay_p50, delay_p90, missed, limit, ...),
``answers`` (pairs that carried an answer, had one joined, had none to check, or a
prompt id the prompts file lacks) and ``correctness`` (per answer kind and ``all``:
``checkable`` evaluation prompts and ``rates``, the share right for the reference and
each candidate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import policy_flag, write_section

from quantdrift.config import EmbeddingSettings
from quantdrift.evaluation.corpus import CorpusEval, by_prompt, complete, split
from quantdrift.lab.corpus.build import answers, load
from quantdrift.schemas import PairEvent
from quantdrift.services import corpus_eval
from quantdrift.services.corpus_eval import CorpusRequest
from quantdrift.services.pairs import read_pairs

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = "int8"
VARIANTS = ("int4-g64-gptq", "int3-g64")
SECTION = "## Decisions on the traffic corpus"
SIZES = (100, 300, 1000)  # calibration sizes, in prompts (the three)
MODE_NAMES = {"full": "teacher-forced", "no-teacher-forcing": "logprobs", "none": "text only"}


def scenarios(slices: bool, ev: CorpusEval) -> list[dict[str, Any]]:
    """(request fields, variants) per scenario."""
    out: list[dict[str, Any]] = [
        {"variants": VARIANTS},
        {"weights": {("task", "json_extraction"): 3.0}, "variants": VARIANTS},
        {"weights": {("language", "ja"): 3.0}, "variants": VARIANTS},
        {"confine": ("language", "zh"), "share": 0.1, "variants": ("int3-g64",)},
        {"confine": ("length", "long"), "share": 0.1, "variants": ("int3-g64",)},
    ]
    if slices:
        values: Counter[tuple[str, str]] = Counter()
        for pid in ev.eval_pool:
            for dim in ("language", "length", "task", "decoding"):
                if dim in ev.prompts[pid].tags:
                    values[(dim, ev.prompts[pid].tags[dim])] += 1
        for tag, n in sorted(values.items()):
            if n >= 20:
                out.append({"only": tag, "variants": VARIANTS, "slice": True})
    return out


def complete_prompts(path: Path) -> int:
    """Prompts with a noise pair and a pair of every candidate (no scoring needed)."""
    return len(complete(by_prompt(read_pairs(path)), (HEALTHY, *VARIANTS)))


def pool_for(complete_prompts: int, sizes: Sequence[int] = SIZES) -> int:
    """The calibration pool, sized once for the largest calibration the corpus can
    spare while keeping at least two thirds of its prompts for the streams. A corpus
    still being recorded may spare none of the sizes asked: then the largest third it
    can spare is the pool (the benches that use it say so).

    >>> pool_for(575), pool_for(3000), pool_for(90)
    (100, 1000, 30)
    """
    return max((s for s in sizes if s <= complete_prompts // 3), default=complete_prompts // 3)


def pool_size(path: Path, sizes: Sequence[int] = SIZES) -> tuple[int, int]:
    """(complete prompts, calibration pool) of the corpus at ``path``."""
    n = complete_prompts(path)
    return n, pool_for(n, sizes)


def cut(pairs: Sequence[PairEvent], seed: int = 0) -> tuple[set[str], set[str]]:
    """(calibration pool, evaluation prompts) by prompt id, as this bench cuts the
    corpus at ``seed`` (the split :class:`CorpusEval` makes): for the benches that read
    the same prompts another way and must keep their calibration apart the same way."""
    full = complete(by_prompt(pairs), (HEALTHY, *VARIANTS))
    cal, ev = split(full, pool_for(len(full)), seed)
    return set(cal), set(ev)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "corpus" / "pairs")
    ap.add_argument(
        "--prompts",
        type=Path,
        default=ROOT / "corpus" / "prompts.jsonl.gz",
        help="the corpus's prompts file: checkable answers for pairs recorded without them",
    )
    ap.add_argument("--draws", type=int, default=200, help="calibration draws (one stream each)")
    ap.add_argument("--slice-draws", type=int, default=40, help="draws for the per-slice rows")
    ap.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="calibration sizes, in prompts"
    )
    ap.add_argument("--modes", default="full,no-teacher-forcing,none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-slices", action="store_true", help="skip the per-slice rows")
    ap.add_argument("--embedder", default=None)
    ap.add_argument("--policy", type=Path, default=None, help="a policy file (default: none)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if not args.corpus.exists():
        sys.exit(f"{args.corpus} is missing (quantdrift lab corpus record writes it)")
    if not args.prompts.exists():
        sys.exit(f"{args.prompts} is missing (quantdrift lab corpus build writes it)")
    expected = answers(load(args.prompts))
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "bench": "eval_corpus",
        "draws": args.draws,
        "slice_draws": args.slice_draws,
        "policy": str(args.policy) if args.policy else None,
        "rows": [],
    }
    # The pool depends on the corpus alone, not on the mode: counted once.
    _, pool = pool_size(args.corpus, sizes)
    skipped = [str(s) for s in sizes if s > pool]
    for mode in args.modes.split(","):
        base = CorpusRequest(
            pairs=args.corpus,
            healthy_label=HEALTHY,
            variants=VARIANTS,
            calibration_prompts=sizes[0],
            logprobs=mode,  # type: ignore[arg-type]
            seed=args.seed,
            embedder=args.embedder,
            answers=expected,
            policy_file=args.policy,
        )
        ev = corpus_eval.load(
            EmbeddingSettings(), CorpusRequest(**{**base.__dict__, "calibration_pool": pool})
        )
        result["distinct_eval_prompts"] = len(ev.eval_pool)
        result["calibration_pool"] = pool
        result["calibration_prompts"] = [s for s in sizes if s <= pool] or [pool]
        # Answers do not depend on the mode: the last mode's count stands for all.
        result["answers"] = ev.joined.as_dict()
        result["correctness"] = {
            kind: {"checkable": c.checkable, "rates": c.rates()}
            for kind, c in sorted(ev.correctness(VARIANTS).items())
        }
        for size in result["calibration_prompts"]:
            for sc in scenarios(not args.no_slices, ev):
                if sc.get("slice") and (size != min(300, pool) or mode != "full"):
                    continue
                fields = {k: v for k, v in sc.items() if k not in ("variants", "slice")}
                request = CorpusRequest(
                    **{
                        **base.__dict__,
                        "calibration_pool": pool,
                        "calibration_prompts": size,
                        "variants": tuple(sc["variants"]),
                        "draws": args.slice_draws if sc.get("slice") else args.draws,
                        **fields,
                    }
                )
                rows = corpus_eval.run(ev, request)
                for r in rows:
                    row = r.as_dict()
                    row["mode"] = MODE_NAMES[mode]
                    result["rows"].append(row)
                print(
                    f"eval_corpus: {MODE_NAMES[mode]} cal {size} {rows[0].scenario}: "
                    f"{rows[0].false_rollbacks} false / {rows[0].healthy_pairs} "
                    f"({time.perf_counter() - t0:.0f}s)",
                    file=sys.stderr,
                    flush=True,
                )
    result["calibration_sizes_skipped"] = skipped
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if args.write:
        write_section(args.write, markdown(result), SECTION)
    print(json.dumps(result) if args.json else markdown(result))
    return 0


def _d(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        SECTION,
        "",
        f"`python bench/eval_corpus.py --draws {result['draws']} --slice-draws "
        f"{result.get('slice_draws', '-')}{policy_flag(result.get('policy'))}`: "
        f"{result['distinct_eval_prompts']} distinct evaluation prompts, each at most once a "
        f"stream; calibration from a pool of {result['calibration_pool']} other prompts, "
        f"drawn {result['draws']} times per size; broken variants from a random onset in the "
        "first half of the stream. Delays: median over caught streams / p90 counting a miss "
        "as the rest of its stream, in route pairs (slice pairs in brackets for confined "
        "drift); *limit*: the information limit on the same pairs.",
        "",
        "| scenario | mode | calibration | false rollbacks (streams) | variant | delay p50 / p90 "
        "| missed | limit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if r["variant"] == "-":
            continue
        delay = f"{_d(r['delay_p50'])} / {_d(r['delay_p90'])}"
        if r["scenario"].startswith("confined"):
            delay += f" [{_d(r['slice_delay_p50'])} / {_d(r['slice_delay_p90'])}]"
        lines.append(
            f"| {r['scenario']} | {r['mode']} | {r['calibration_prompts']} | "
            f"{r['false_rollbacks']} of {r['healthy_pairs']:,} ({r['streams']}) | "
            f"{r['variant']} | {delay} | {r['missed']} | {_d(r['limit'])} |"
        )
    lines += correctness_lines(result)
    if result.get("calibration_sizes_skipped"):
        lines += [
            "",
            "Calibration sizes not run (the corpus cannot spare them and keep two thirds "
            f"for the streams): {', '.join(result['calibration_sizes_skipped'])}.",
        ]
    return "\n".join(lines) + "\n"


def correctness_lines(result: dict[str, Any]) -> list[str]:
    """The correctness table: per answer kind, checkable evaluation prompts and the share
    each side got right."""
    table = result.get("correctness") or {}
    if not table:
        return []
    sides = list(table["all"]["rates"])
    a = result["answers"]
    lines = [
        "",
        f"Correctness on the checkable evaluation prompts (answers: {a['carried']:,} pairs "
        f"carried their own, {a['joined']:,} joined from the prompts file, "
        f"{a['unchecked']:,} with nothing to check, {a['unknown']:,} unknown to it):",
        "",
        "| answer kind | checkable prompts | " + " | ".join(sides) + " |",
        "|---|---" + "|---" * len(sides) + "|",
    ]
    kinds = [*sorted(k for k in table if k != "all"), "all"]
    for kind in kinds:
        rates = table[kind]["rates"]
        cells = " | ".join(f"{100 * rates.get(s, 0.0):.1f} %" for s in sides)
        lines.append(f"| {kind} | {table[kind]['checkable']} | {cells} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
