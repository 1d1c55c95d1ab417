"""``quantdrift eval --healthy H.jsonl [--drifted D.jsonl] [--calibrate N.jsonl] ...``.

Replays labelled PairEvent files through the judge in memory (no broker, no
Redis, no side effects): every distinct pair is scored once (metrics cached by
content), then judged under named policies: ``default`` (the production default,
or ``--policy`` as written), ``seeds`` (the seeds' K-consecutive rule with their
thresholds), and on request ``windowed`` and ``sequential``.

Two ways to run:

* ``--streams K --length N --seed S``: K seeded streams of N healthy shadow pairs
  resampled from ``--healthy``, each followed by ``--drift-length`` pairs
  resampled from ``--drifted`` (one pool per ``--drifted-label`` value, each
  starting from the same healthy streams); ``--calibration-draws D`` judges them
  from D seeded resamples of the calibration prompts instead of one calibration,
  and counts over all D x K streams; one JSON array (``--json``), an object
  per policy and pool, with
  false rollbacks per 100k healthy pairs (and the 95 % upper bound), detection
  delay median / p90 and missed streams (:mod:`quantdrift.evaluation.long`).
* without ``--streams``: the files as they are, in file order (``--repeat`` to
  replay the healthy part), per-route results (:mod:`quantdrift.evaluation.runner`).

* ``--no-replay``: a recorded traffic corpus (``--healthy`` a file or the folder of
  ``quantdrift lab corpus record``) as an operator meets it: each evaluation prompt at
  most once per stream, the calibration drawn ``--calibration-draws`` times from
  ``--calibration-prompts`` prompts none of the streams use, a broken variant
  (``--drifted-label``) from a random onset; ``--mix task=code:3`` shifts the
  stream's mix (repeatable), ``--confine language=zh --confine-share 0.1`` confines the
  drift to one slice at that share of traffic, ``--only language=zh`` judges a route
  that carries one slice only (:mod:`quantdrift.evaluation.corpus`). ``--prompts``
  (the corpus's prompts file) gives pairs recorded without a checkable answer their
  prompt's, so the outcome test judges correctness; the table's footer then says how
  often each side got the checkable prompts right (:mod:`quantdrift.evaluation.answers`).

``--holdout`` keeps the lab's prompt split honest: streams use only the
evaluation part of the prompts, floors and blessed baselines only the
calibration part. ``--embedder`` builds exactly the scorer it names; its
default is the scorer the worker uses (settings ``embedding.tier``).
"""

from __future__ import annotations

import argparse
import json
import sys
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
    p.set_defaults(func=run)


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


def run(args: argparse.Namespace) -> int:
    # Deferred: the service loads the scorers, which `quantdrift --help` never needs.
    from quantdrift.cli.common import load_settings
    from quantdrift.cli.progress import self_closing
    from quantdrift.services.evaluation import EvalRequest, run_eval

    if args.no_replay:
        return _corpus(args)
    request = EvalRequest(
        healthy=args.healthy,
        drifted=args.drifted,
        calibrate=args.calibrate,
        healthy_labels=args.healthy_label,
        drifted_labels=args.drifted_label,
        blessed_labels=args.blessed_label,
        policy_file=args.policy,
        policies=args.policies,
        embedder=args.embedder,
        decoding=args.decoding,
        logprobs=args.logprobs,
        holdout=args.holdout,
        streams=args.streams,
        length=args.length,
        drift_length=args.drift_length,
        seed=args.seed,
        calibration_draws=args.calibration_draws,
        repeat=args.repeat,
        noise_as_shadow=args.noise_as_shadow,
        pair_interval_s=args.pair_interval,
    )
    outcome = run_eval(
        load_settings().embedding,
        request,
        progress=self_closing(not args.no_progress, "score pairs"),
    )
    for note in outcome.notes:
        sys.stderr.write(f"eval: {note}\n")
    if args.json:
        print(json.dumps(outcome.rows))
    else:
        print(outcome.table)
        print(outcome.footer)
    return 0


def _corpus(args: argparse.Namespace) -> int:
    from quantdrift.cli.common import load_settings
    from quantdrift.cli.progress import self_closing
    from quantdrift.evaluation.corpus import format_corpus
    from quantdrift.lab.corpus.build import answers, load
    from quantdrift.services import corpus_eval

    if not args.healthy_label or len(args.healthy_label) != 1:
        sys.stderr.write("quantdrift: error: --no-replay needs one --healthy-label\n")
        return 2
    if args.prompts is not None and not args.prompts.is_file():
        sys.stderr.write(f"quantdrift: error: no such prompts file: {args.prompts}\n")
        return 2
    expected = answers(load(args.prompts)) if args.prompts is not None else {}
    request = corpus_eval.CorpusRequest(
        pairs=args.healthy,
        healthy_label=args.healthy_label[0],
        variants=tuple(args.drifted_label or ()),
        calibration_prompts=args.calibration_prompts,
        calibration_pool=args.calibration_pool,
        draws=args.calibration_draws,
        seed=args.seed,
        logprobs=args.logprobs,
        weights=dict(args.mix),
        confine=args.confine,
        share=args.confine_share,
        only=args.only,
        policy_file=args.policy,
        embedder=args.embedder,
        answers=expected,
    )
    ev = corpus_eval.load(
        load_settings().embedding, request, self_closing(not args.no_progress, "score pairs")
    )
    rows = corpus_eval.run(ev, request)
    if args.json:
        print(json.dumps(corpus_eval.rows_json(rows)))
        return 0
    print(format_corpus(rows))
    print(
        f"{rows[0].distinct_eval_prompts} distinct evaluation prompts, each at most once a "
        f"stream; calibration: {request.calibration_prompts} prompts, {request.draws} draws"
    )
    for kind, c in sorted(ev.correctness(request.variants).items()):
        rates = ", ".join(f"{side} {100 * r:.1f} %" for side, r in c.rates().items())
        print(f"correct, {kind} answers ({c.checkable} checkable prompts): {rates}")
    return 0
