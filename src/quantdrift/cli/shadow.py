"""``quantdrift shadow cost|report``: what a shadow share costs the reference and what it
buys; a route's candidates ranked by cost and quality.

Parses, calls ``services/shadow_cost.py``, prints text or ``--json``. The figures
and how the detection delay is estimated are in ``evaluation/shadow_cost.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from quantdrift.cli.settings import load_settings, with_stack
from quantdrift.evaluation.candidates import cheapest_passing
from quantdrift.services.candidates import as_json as ranked_json
from quantdrift.services.candidates import as_text as ranked_text
from quantdrift.services.candidates import side_by_side
from quantdrift.services.shadow_cost import (
    DEFAULT_DRIFTS,
    CostRequest,
    as_json,
    as_text,
    shadow_cost,
)


def report(args: argparse.Namespace) -> int:
    settings = with_stack(load_settings())
    ranked = asyncio.run(side_by_side(settings, args.config, args.route))
    if args.json:
        print(json.dumps(ranked_json(args.route, ranked)))
    else:
        print(ranked_text(args.route, ranked))
    return 0 if cheapest_passing(ranked) is not None else 1


def run(args: argparse.Namespace) -> int:
    request = CostRequest(
        requests_per_s=args.rate,
        prompt_tokens=args.prompt_tokens,
        completion_tokens=args.completion_tokens,
        reference_prompt_tps=args.reference_prompt_tps,
        reference_completion_tps=args.reference_completion_tps,
        shares=args.share,
        noise_share=args.noise_share,
        teacher_forced=args.teacher_forced,
        drifts=args.drift or DEFAULT_DRIFTS,
        within=args.within,
        route=args.route,
        policy_file=args.policy,
        config_file=args.config,
    )
    found, needed = shadow_cost(request)
    if args.json:
        print(json.dumps(as_json(found, needed, args.within)))
    else:
        print(as_text(found, needed, args.within))
    return 0
