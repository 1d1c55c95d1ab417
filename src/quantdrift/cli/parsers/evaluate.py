"""The flags of ``quantdrift evaluate`` (what it runs: ``quantdrift.cli.evaluate``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import add_seconds, positive_int

POLICY_NAMES = ("default", "seeds", "windowed", "sequential")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval")
    p.add_argument("--healthy", type=Path, required=True, help="PairEvent JSONL(.gz)")
    p.add_argument("--drifted", type=Path, default=None, help="PairEvent JSONL(.gz)")
    p.add_argument(
        "--calibrate",
        type=Path,
        default=None,
        help="noise pairs (and --blessed-label shadow pairs) that seed the floor",
    )
    p.add_argument("--healthy-label", type=_labels, default=None, help="keep only these labels")
    p.add_argument("--drifted-label", type=_labels, default=None, help="keep only these labels")
    p.add_argument(
        "--blessed-label",
        type=_labels,
        default=None,
        help="shadow pairs of --calibrate with these labels are the blessed baseline",
    )
    p.add_argument("--policy", type=Path, default=None, help="YAML policy (default: built-in)")
    p.add_argument(
        "--policies",
        type=_policies,
        default=("default", "seeds"),
        help=f"comma-separated, from {', '.join(POLICY_NAMES)} (default: default,seeds)",
    )
    p.add_argument(
        "--embedder",
        choices=("minilm", "tiered", "static", "none"),
        default=None,
        help="the scorer to build (default: the worker's, settings embedding.tier)",
    )
    p.add_argument("--decoding", choices=("any", "greedy", "sampled"), default="any")
    p.add_argument(
        "--logprobs",
        choices=("full", "no-teacher-forcing", "none"),
        default="full",
        help="strip the pairs to what a gateway without (teacher-forced) log-probs sends",
    )
    p.add_argument(
        "--holdout",
        action="store_true",
        help="streams from the evaluation part of the prompts, floors from the calibration part",
    )
    p.add_argument("--streams", type=positive_int, default=None, help="K seeded long streams")
    p.add_argument("--length", type=positive_int, default=5000, help="healthy pairs per stream")
    p.add_argument("--drift-length", type=positive_int, default=200, help="drifted pairs/stream")
    p.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    p.add_argument(
        "--calibration-draws",
        type=positive_int,
        default=1,
        help="with --streams: judge the streams from D seeded resamples of the calibration "
        "prompts (none the streams use), rates and delays over all draws (default 1: as given)",
    )
    p.add_argument("--repeat", type=positive_int, default=1, help="replay the healthy part N times")
    p.add_argument(
        "--noise-as-shadow",
        action="store_true",
        help="judge every other noise pair of --healthy as a shadow pair (the rest feed the floor)",
    )
    c = p.add_argument_group("a recorded traffic corpus (--no-replay)")
    c.add_argument(
        "--no-replay",
        action="store_true",
        help="streams draw each evaluation prompt at most once (a corpus of distinct prompts)",
    )
    c.add_argument("--calibration-prompts", type=positive_int, default=300)
    c.add_argument(
        "--calibration-pool",
        type=positive_int,
        default=None,
        help="prompts set apart for calibration (default: --calibration-prompts)",
    )
    c.add_argument(
        "--mix",
        type=_mix,
        action="append",
        default=[],
        metavar="DIM=VALUE:WEIGHT",
        help="weight a tag value in the streams' mix (repeatable), e.g. task=code:3",
    )
    c.add_argument("--confine", type=_tag, default=None, metavar="DIM=VALUE")
    c.add_argument("--confine-share", type=_share, default=0.1)
    c.add_argument("--only", type=_tag, default=None, metavar="DIM=VALUE")
    c.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help="the corpus's prompts file (quantdrift lab corpus build): checkable answers "
        "for pairs recorded without them",
    )
    add_seconds(p, "pair-interval", 1.0, "simulated seconds per pair")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON array: an object per policy")
    p.set_defaults(func="run")


def _labels(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(",") if v.strip())
    if not names:
        raise argparse.ArgumentTypeError("give at least one label")
    return names


def _tag(text: str) -> tuple[str, str]:
    dim, sep, value = text.partition("=")
    if not sep or not dim.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected DIM=VALUE, e.g. language=zh")
    return dim.strip(), value.strip()


def _mix(text: str) -> tuple[tuple[str, str], float]:
    tag, sep, weight = text.rpartition(":")
    try:
        w = float(weight)
    except ValueError:
        w = -1.0
    if not sep or w <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected DIM=VALUE:WEIGHT, e.g. task=code:3")
    return _tag(tag), w


def _share(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a share in (0, 1), e.g. 0.1")
    return v


def _policies(text: str) -> tuple[str, ...]:
    names = _labels(text)
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(bad)}; choose from {', '.join(POLICY_NAMES)}"
        )
    if "default" not in names:
        names = ("default", *names)  # the production default is always reported
    return names
