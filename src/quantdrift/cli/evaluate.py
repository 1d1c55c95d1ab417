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

from quantdrift.cli.progress import self_closing
from quantdrift.cli.settings import load_settings
from quantdrift.evaluation.corpus import format_corpus
from quantdrift.lab.corpus.build import answers, load
from quantdrift.services import corpus_eval
from quantdrift.services.evaluation import EvalRequest, run_eval


def run(args: argparse.Namespace) -> int:
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
