"""The flags of ``quantdrift shadow`` (what it runs: ``quantdrift.cli.shadow``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("shadow")
    actions = p.add_subparsers(dest="action", required=True)
    c = actions.add_parser(
        "cost",
        help="reference capacity, pairs per hour and time to catch a drift at a share",
        description="Estimate what shadowing a route costs the reference and how soon it "
        "catches a drift. The delay is an analytic expected delay of the judge's e-process "
        "under the route's policy (docs/collector.md, 'What shadowing costs').",
    )
    c.add_argument("--rate", type=_number, required=True, help="the route's requests per second")
    c.add_argument("--prompt-tokens", type=_number, required=True, help="mean per request")
    c.add_argument("--completion-tokens", type=_number, required=True, help="mean per request")
    c.add_argument("--reference-prompt-tps", type=_number, required=True,
                   help="one reference replica's measured prompt (prefill) tokens/s")  # fmt: skip
    c.add_argument("--reference-completion-tps", type=_number, required=True,
                   help="one reference replica's measured decode tokens/s")  # fmt: skip
    c.add_argument("--share", type=_number, action="append", default=[],
                   help="shadow share in (0, 1]; repeat for a table (default: the route's, "
                   "else 0.05)")  # fmt: skip
    c.add_argument("--noise-share", type=_number, default=None,
                   help="noise share (default: the route's, else 0)")  # fmt: skip
    c.add_argument("--teacher-forced", action=argparse.BooleanOptionalAction, default=None,
                   help="count a forced pass per shadow pair (default: the route's)")  # fmt: skip
    c.add_argument("--drift", action="append", default=None, metavar="SIGNAL=RATE",
                   help="hard=P (hard failures on P of pairs) or outcomes=D (D more failed "
                   "tasks than the reference); repeatable (default: hard=0.1, "
                   "outcomes=0.1)")  # fmt: skip
    c.add_argument("--within", default=None, help="also give the share that catches each "
                   "drift within this time, e.g. 1h")  # fmt: skip
    c.add_argument("--route", default=None, help="the route whose policy and config apply")
    c.add_argument("--policy", type=Path, default=None, help="policy YAML (default: built-in)")
    c.add_argument("--config", type=Path, default=None, help="gateway config YAML")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func="run")
    r = actions.add_parser(
        "report",
        help="a route's candidates ranked by cost and quality: the cheapest build that passes",
        description="Each candidate pool of a route (its candidate and extra_candidates) "
        "with the breaker's verdict on it and its declared cost. Exit 1 when no build passes.",
    )
    r.add_argument("--config", type=Path, required=True, help="gateway config YAML")
    r.add_argument("--route", required=True, help="the route, e.g. cs-agent/int4")
    r.add_argument("--json", action="store_true", help="print JSON")
    r.set_defaults(func="report")
