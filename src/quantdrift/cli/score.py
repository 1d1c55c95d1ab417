"""``quantdrift score CANDIDATE REFERENCE [--json] [--embedder minilm|tiered|static|none]``.

Every metric of one pair, and the per-pair verdict with its reasons: what
on-call and analysts run on a worst pair from an alert. Each text is given
inline, as ``@path`` (read from a file) or ``-`` (read from stdin; at most one
side). With ``--json``: one object whose keys include ``rouge1``, ``rougeL`` and
``bleu`` (F-scores in [0, 1]), ``cosine``, ``verdict`` and ``reasons``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from quantdrift.cli.settings import load_settings
from quantdrift.detectors import score_text_pair, verdict
from quantdrift.embedding.factory import score_with
from quantdrift.schemas import ModelOutput, PairEvent
from quantdrift.services.scoring import build_embedder


def _fail(message: str) -> int:
    sys.stderr.write(f"quantdrift: error: {message}\n")
    return 2


def read_text(arg: str, stdin: Any) -> str:
    """``-`` reads stdin, ``@path`` reads a file, anything else is the text itself."""
    if arg == "-":
        return str(stdin.read())
    if arg.startswith("@") and len(arg) > 1:
        path = Path(arg[1:])
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ValueError(f"no such file: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc}") from None
    return arg


def run(args: argparse.Namespace) -> int:
    if args.candidate == "-" and args.reference == "-":
        return _fail("only one of CANDIDATE and REFERENCE can be read from stdin (-)")
    try:
        candidate = read_text(args.candidate, sys.stdin)
        reference = read_text(args.reference, sys.stdin)
    except ValueError as exc:
        return _fail(str(exc))
    embedder, _tier = build_embedder(load_settings().embedding, args.embedder)
    if embedder is None:
        metrics = score_text_pair(candidate, reference, None)
    else:
        # Through the same path as the worker, so a tiered scorer escalates as it would.
        pair = PairEvent(
            pair_id="cli",
            ts=0.0,
            route="cli/score",
            candidate=ModelOutput(text=candidate),
            reference=ModelOutput(text=reference),
        )
        metrics = score_with(embedder, [pair])[0]
    v, reasons = verdict(metrics)
    out = {**metrics.model_dump(), "verdict": v, "reasons": reasons}
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
        return 0
    width = max(len(k) for k in out)
    for key, value in out.items():
        if key == "reasons":
            value = "; ".join(reasons) or "-"
        elif isinstance(value, float):
            value = f"{value:.4f}"
        elif value is None:
            value = "-"
        print(f"{key.ljust(width)}  {value}")
    return 0
