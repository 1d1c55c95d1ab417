"""``quantdrift distill [--out DIR] [--pairs FILE ...] [--calibrate-only] [--json]``.

Builds the static-embedding tier from the packaged all-MiniLM-L6-v2 (model2vec
distillation, 256 PCA dims, int8 rows; ~40 s on one core, nothing downloaded)
and fits its calibration onto MiniLM's cosine scale from PairEvent files
(default: the lab pairs shipped in the package, when there are any). The
package ships the result in ``quantdrift/data/static_minilm``; this command
rebuilds or recalibrates it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quantdrift.embedding.minilm import SentenceTransformerEmbedder
from quantdrift.embedding.static import (
    CALIBRATION_FILE,
    StaticEmbedder,
    calibrate,
    distill_static,
    packaged_static_path,
)
from quantdrift.services.pairs import read_pairs


def run(args: argparse.Namespace) -> int:
    out = args.out or packaged_static_path()
    if not args.calibrate_only:
        distill_static(out)
        print(f"distilled the packaged MiniLM into {out}")
    pairs = _pairs(args.pairs)
    if not pairs:
        print("no pairs to calibrate on (give --pairs); calibration left as it is")
        return 0
    static = StaticEmbedder(out)
    full = SentenceTransformerEmbedder(threads=1)
    cands = [p.candidate.text for p in pairs]
    refs = [p.reference.text for p in pairs]
    names = ", ".join(str(p) for p in args.pairs) if args.pairs else "shipped lab pairs"
    cal, report = calibrate(static, full, cands, refs, threshold=args.threshold, fitted_on=names)
    (out / CALIBRATION_FILE).write_text(cal.to_json() + "\n")
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>26}  {value:.4g}")
    return 0


def _pairs(paths: list[Path] | None) -> list:  # type: ignore[type-arg]

    if paths:
        return [p for path in paths for p in read_pairs(path)]
    try:
        return read_pairs(None)
    except (FileNotFoundError, ModuleNotFoundError):
        return []
