"""The decision table per mode, for the lab's pairs and for pairs recorded on real vLLM.

    python bench/eval_modes.py [--streams 20] [--length 5000] [--calibration-draws 5]
                               [--json] [--write docs/vllm.md]

For each pair set, every mode (greedy / sampled x teacher-forced log-probs /
log-probs without teacher forcing / text only), the protocol of docs/deciding.md:
floors and the blessed int8 baseline from the calibration prompts, seeded long
streams of healthy int8 pairs from the evaluation prompts, each followed by a
broken variant's pairs (``quantdrift eval --holdout --streams S --length N``, the
default policy). Rows give false rollbacks per 100k (with the 95 % upper bound),
and per broken variant the detection delay median / p90 in pairs and the streams
missed.

The calibration is not one fixed draw: ``--calibration-draws D`` (default 5)
resamples the calibration prompts D times (a bootstrap over prompts, none of them a
prompt the streams use; ``quantdrift eval --calibration-draws``), and each draw's
floors and blessed baseline judge ``streams / D`` streams of their own. A false
rollback that only an unlucky calibration causes is counted, as an operator who
calibrates once would meet it.

The sets:

* ``lab``: ``src/quantdrift/data/lab_pairs.jsonl.gz``, the transformers lab
  (``quantdrift lab generate``);
* ``vllm``: ``src/quantdrift/data/lab_pairs_vllm.jsonl.gz``, the same prompts and
  protocol served by vLLM through the gateway (``bench/lab_pairs_vllm.py``),
  with ``int4-gptq`` (the GPTQ W4A16 checkpoint on vLLM's int4 kernel) beside
  RTN ``int4``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from common import policy_flag, write_section

from quantdrift.config import EmbeddingSettings
from quantdrift.services.evaluation import EvalRequest, run_eval

DATA = Path(__file__).resolve().parent.parent / "src" / "quantdrift" / "data"
SETS: dict[str, tuple[Path, tuple[str, ...]]] = {
    "lab": (DATA / "lab_pairs.jsonl.gz", ("int4", "int3", "int2")),
    "vllm": (DATA / "lab_pairs_vllm.jsonl.gz", ("int4", "int4-gptq", "int3", "int2")),
}
MODES = [(d, lp) for d in ("greedy", "sampled") for lp in ("full", "no-teacher-forcing", "none")]
SECTION = "## Decisions on pairs recorded through vLLM"
LOGPROBS = {"full": "teacher-forced", "no-teacher-forcing": "logprobs", "none": "text only"}


def run_mode(
    path: Path, drifted: tuple[str, ...], decoding: str, logprobs: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One ``quantdrift eval`` of a mode: a row per broken variant."""
    request = EvalRequest(
        healthy=path,
        drifted=path,
        calibrate=path,
        healthy_labels=("int8",),
        drifted_labels=drifted,
        blessed_labels=("int8",),
        policies=("default",),
        embedder=args.embedder,
        decoding=decoding,  # type: ignore[arg-type]
        logprobs=logprobs,  # type: ignore[arg-type]
        holdout=True,
        streams=args.streams // args.calibration_draws,
        length=args.length,
        seed=args.seed,
        calibration_draws=args.calibration_draws,
        policy_file=getattr(args, "policy", None),
    )
    # MiniLM's dtype (embedding.dtype); decisions.py's ``*-bf16`` scorers set it.
    return run_eval(EmbeddingSettings(dtype=getattr(args, "dtype", "float32")), request).rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's false rollbacks and its delays per broken variant.

    Every row of one eval replays the same healthy streams before its own broken
    pairs (``evaluation/long.py``), so the false rollbacks are the first row's."""
    first = rows[0]
    return {
        "healthy_pairs": first["healthy_pairs"],
        "false_rollbacks": first["false_rollbacks"],
        "per_100k": first["false_rollbacks_per_100k"],
        "upper95_per_100k": first["false_rollbacks_per_100k_upper95"],
        "streams_with_false_rollback": first["streams_with_false_rollback"],
        "false_rollback_rules": first["false_rollback_rules"],
        "delays": {
            r["drifted"]: {
                "median": r["detection_delay_pairs"],
                "p90": r["detection_delay_p90"],
                "missed": r["missed"],
                "streams": r["streams"],
                "detected_by": r["detected_by"],
                "limit": r.get("information_limit_pairs"),
            }
            for r in rows
        },
        "floor": first.get("floor"),
        "distinct_healthy": first.get("distinct_healthy"),
    }


def fmt_delay(d: dict[str, Any] | None) -> str:
    """``median / p90``, with the streams missed, and the streams whose route was
    already rolled back when the broken pairs began (its healthy part tripped it)."""
    if d is None:
        return "-"
    med, p90 = d["median"], d["p90"]
    text = f"{'-' if med is None else f'{med:g}'} / {'-' if p90 is None else f'{p90:g}'}"
    notes = []
    if d["missed"]:
        notes.append(f"{d['missed']} missed")
    if opened := d.get("detected_by", {}).get("open at onset"):
        notes.append(f"{opened} open at onset")
    if d.get("limit") is not None:
        notes.append(f"limit {d['limit']:g}")
    return text + (f" ({', '.join(notes)})" if notes else "")


def markdown(result: dict[str, Any]) -> str:
    labels = ["int4", "int4-gptq", "int3", "int2"]
    policy = result.get("policy")
    lines = [
        SECTION,
        "",
        f"`python bench/eval_modes.py --streams {result['streams']} --length "
        f"{result['length']} --seed {result['seed']} --calibration-draws "
        f"{result['calibration_draws']}{policy_flag(policy)}`: "
        "the protocol of docs/deciding.md (floors and the blessed int8 baseline from the "
        "calibration prompts, streams from the evaluation prompts, "
        + (f"the policy file `{policy}`" if policy else "the default policy")
        + f"), the calibration resampled "
        f"{result['calibration_draws']} times (a bootstrap over the calibration prompts; "
        "each draw judges its own share of the streams), on two pair sets recorded with the "
        "same prompts: `lab` by the transformers lab, `vllm` by real vLLM engines through "
        "the gateway (`bench/lab_pairs_vllm.py`). Each mode replays "
        f"{result['streams']} healthy streams of {result['length']:,} int8 pairs; delays are "
        "median / p90 pairs from the onset of the broken variant (a missed stream counts "
        "as one more than its broken pairs; a route already rolled back by its healthy "
        "part is open at the onset, with delay 0). *limit*: the information limit, the "
        "pairs an oracle fitted on these very pairs would need on average at alpha 1e-4 "
        "(`evaluation/limit.py`; optimistic on purpose). *distinct*: how many distinct "
        "int8 pairs the healthy streams draw from (with replacement; the evaluation "
        "prompts' recorded pairs of that mode): a false rollback per 100k says how often "
        "these few prompts' mean outruns the null under a resampled calibration, not how "
        "100k pairs of fresh prompts would fare; the streams it happened in follow the "
        "rate.",
        "",
        "| set | mode | distinct | false rollbacks / 100k (upper 95 %) | "
        + " | ".join(f"{lab} median / p90" for lab in labels)
        + " |",
        "|---|---|---|---|" + "---|" * len(labels),
    ]
    for name, modes in result["sets"].items():
        for mode, s in modes.items():
            fr = f"{s['per_100k']:g} ({s['upper95_per_100k']:g})"
            if hit := s.get("streams_with_false_rollback"):
                fr += f", in {hit} of {result['streams']} streams"
            distinct = s.get("distinct_healthy")
            cells = [fmt_delay(s["delays"].get(lab)) for lab in labels]
            lines.append(
                f"| {name} | {mode} | {'-' if distinct is None else distinct} | {fr} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--length", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--calibration-draws",
        type=int,
        default=5,
        help="resampled calibrations; --streams is split evenly over them",
    )
    ap.add_argument("--embedder", default=None, help="the worker's default when not given")
    ap.add_argument("--policy", type=Path, default=None, help="a policy file (default: none)")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.calibration_draws < 1 or args.streams % args.calibration_draws:
        ap.error("--streams must be a positive multiple of --calibration-draws")
    result: dict[str, Any] = {
        "streams": args.streams,
        "calibration_draws": args.calibration_draws,
        "length": args.length,
        "seed": args.seed,
        "policy": str(args.policy) if args.policy else None,
        "sets": {},
    }
    for name in args.sets.split(","):
        path, drifted = SETS[name]
        if not path.exists():
            sys.exit(f"{path} is missing (bench/lab_pairs_vllm.py records it)")
        modes: dict[str, Any] = {}
        for decoding, logprobs in MODES:
            rows = run_mode(path, drifted, decoding, logprobs, args)
            modes[f"{decoding}, {LOGPROBS[logprobs]}"] = summarise(rows)
            print(f"eval_modes: {name} {decoding} {logprobs} done", file=sys.stderr, flush=True)
        result["sets"][name] = modes
    text = markdown(result)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        print(json.dumps({"bench": "eval_modes", **result}))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
