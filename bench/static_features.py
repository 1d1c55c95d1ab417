"""Can a better static tier decide alone? Static cosine + lexical features against MiniLM.

Issue 13 names "a better static tier" as a means to make escalation rare. This
measures the ceiling of that means on the pairs the scorer already has at hand:
the static cosine plus the suite's lexical scores (ROUGE-L, ROUGE-1, Jaccard,
length ratio, BLEU), fed to a model fitted to MiniLM's cosine:

* ``isotonic (shipped)``: the packaged calibration (static cosine alone);
* ``linear``: least squares over all six features (scikit-learn);
* ``gradient boosting``: scikit-learn's HistGradientBoostingRegressor, seeded.

The models are fitted on pairs the evaluation never sees: bench pairs of
another seed (``long_pairs(seed=7)``) and a seeded sample of the traffic corpus's
*calibration* pool. They are evaluated on the bench pairs ``bench/scoring.py``
measures agreement on (seed 0, the same slice) and on its sample of the corpus's
*evaluation* prompts (the corpus cut as ``bench/eval_corpus.py`` cuts it). Reported per
set: the share of pairs whose drift decision at the threshold (0.88) differs
from MiniLM's when the model decides alone, the share inside the model's band
(which the tiered scorer would have to escalate), and the residuals.

    python bench/static_features.py [--train-pairs 400] [--corpus-pairs 400] [--json]
                                    [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import long_pairs, write_section

THRESHOLD = 0.88
NEAR = 0.15  # the band is the 90 % residual quantile of fitting pairs this close to the bar
SECTION = "## A better static tier? Static cosine + lexical features against MiniLM"
FEATURES = ["static cosine", "ROUGE-L", "ROUGE-1", "Jaccard", "length ratio", "BLEU"]


def features(pairs: Sequence[Any], static: Any, full: Any) -> dict[str, Any]:
    """Static and MiniLM cosines and the lexical scores of each pair."""
    from quantdrift.detectors.bleu import sentence_bleu
    from quantdrift.detectors.lexical import (
        jaccard,
        length_ratio,
        rouge1_f,
        rougeL_f,
    )
    from quantdrift.detectors.semantic import cosine_pairs
    from quantdrift.detectors.tokenize import tokenize

    cands = [p.candidate.text for p in pairs]
    refs = [p.reference.text for p in pairs]
    s = cosine_pairs(static, cands, refs).astype(np.float64)
    m = cosine_pairs(full, cands, refs).astype(np.float64)
    lex = []
    for a, b in zip(cands, refs, strict=True):
        ta, tb = tokenize(a), tokenize(b)
        lex.append(
            [
                rougeL_f(ta, tb),
                rouge1_f(ta, tb),
                jaccard(ta, tb),
                length_ratio(ta, tb),
                sentence_bleu(a, b),
            ]
        )
    return {"x": np.column_stack([s, np.asarray(lex, dtype=np.float64)]), "minilm": m}


def judge(
    predict: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
    band: float,
    data: dict[str, Any],
) -> dict[str, Any]:
    p, m = predict(data["x"]), data["minilm"]
    flips = (p < THRESHOLD) != (m < THRESHOLD)
    inside = np.abs(p - THRESHOLD) <= band
    return {
        "pairs": int(m.size),
        "decision_flips_alone": round(float(flips.mean()), 4),
        "flips_outside_band": round(float((flips & ~inside).mean()), 4),
        "in_band": round(float(inside.mean()), 4),
        "mean_abs_error": round(float(np.abs(p - m).mean()), 4),
        "minilm_within_0.05_of_bar": round(float((np.abs(m - THRESHOLD) <= 0.05).mean()), 4),
    }


def band_of(pred: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> float:
    near = np.abs(pred - THRESHOLD) <= NEAR
    res = np.abs(pred - y)[near] if near.sum() >= 30 else np.abs(pred - y)
    return float(np.quantile(res, 0.9))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import LinearRegression

    torch.set_num_threads(1)
    from scoring import corpus_pairs

    from quantdrift.embedding.minilm import SentenceTransformerEmbedder
    from quantdrift.embedding.static import StaticEmbedder, load_calibration

    t0 = time.perf_counter()
    full = SentenceTransformerEmbedder(threads=1)
    static = StaticEmbedder()
    shipped = load_calibration(static.path)
    # bench/scoring.py's agreement pairs: long_pairs(seed 0)[1032:1168][8:].
    bench_eval = long_pairs(1168, seed=0)[1040:1168]
    sets = {
        "fit: bench pairs, seed 7": features(long_pairs(args.train_pairs, seed=7), static, full),
        "fit: corpus calibration pool": features(
            corpus_pairs("calibration", args.corpus_pairs), static, full
        ),
        "bench pairs (scoring.py's)": features(bench_eval, static, full),
        "corpus evaluation prompts": features(corpus_pairs("evaluation"), static, full),
    }
    fit_names = [k for k in sets if k.startswith("fit:")]
    x_fit = np.vstack([sets[k]["x"] for k in fit_names])
    y_fit = np.concatenate([sets[k]["minilm"] for k in fit_names])

    linear = LinearRegression().fit(x_fit, y_fit)
    boosted = HistGradientBoostingRegressor(
        max_iter=200, learning_rate=0.05, max_depth=3, random_state=0
    ).fit(x_fit, y_fit)
    models: dict[str, tuple[Callable[[Any], Any], float]] = {
        "isotonic (shipped)": (lambda x: shipped.apply(x[:, 0]).astype(np.float64), shipped.band),
        "linear": (linear.predict, band_of(linear.predict(x_fit), y_fit)),
        "gradient boosting": (boosted.predict, band_of(boosted.predict(x_fit), y_fit)),
    }
    rows = []
    for name, (predict, band) in models.items():
        for set_name in ("bench pairs (scoring.py's)", "corpus evaluation prompts"):
            rows.append(
                {"model": name, "band": round(band, 4), "set": set_name}
                | judge(predict, band, sets[set_name])
            )
    return {
        "bench": "static_features",
        "threshold": THRESHOLD,
        "features": FEATURES,
        "fitted_on_pairs": int(y_fit.size),
        "rows": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def markdown(result: dict[str, Any], train_pairs: int, corpus_pairs: int) -> str:
    lines = [
        SECTION,
        "",
        f"`python bench/static_features.py --train-pairs {train_pairs} --corpus-pairs "
        f"{corpus_pairs}`: a model of MiniLM's "
        f"cosine from {', '.join(result['features'])}, fitted on "
        f"{result['fitted_on_pairs']} pairs the evaluation never sees (bench pairs of another "
        "seed, pairs of the traffic corpus's calibration pool). *Flips alone*: the share of "
        "pairs whose decision "
        f"at {result['threshold']} differs from MiniLM's when the model decides every pair; "
        "*in band*: the share the tiered scorer would escalate with the model's band (90 % "
        "residual quantile near the bar, on the fitting pairs); *flips outside*: wrong "
        "decisions left even with every in-band pair escalated.",
        "",
        "| model | band | pairs | flips alone | in band | flips outside | mean abs error "
        "| MiniLM within ±0.05 of the bar |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['model']} | {r['band']} | {r['set']} ({r['pairs']}) "
            f"| {r['decision_flips_alone']:.1%} | {r['in_band']:.1%} "
            f"| {r['flips_outside_band']:.1%} | {r['mean_abs_error']} "
            f"| {r['minilm_within_0.05_of_bar']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-pairs", type=int, default=400, help="bench pairs to fit on")
    ap.add_argument(
        "--corpus-pairs", type=int, default=400, help="corpus calibration pairs to fit on"
    )
    ap.add_argument("--json", action="store_true", help="end with one JSON object")
    ap.add_argument("--write", type=Path, default=None, help="write/update a section in this file")
    args = ap.parse_args(argv)
    if not 50 <= args.train_pairs <= 5000:
        sys.exit("--train-pairs must be in 50..5000")
    result = run(args)
    text = markdown(result, args.train_pairs, args.corpus_pairs)
    print(text)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
