"""Offline evaluation of the decision: replay labelled pairs through the judge in memory.

``streams`` turns PairEvent files into per-route streams (healthy, then
drifted), ``calibration`` builds the noise floor's seed values (shared with
``quantdrift calibrate``), ``cache`` scores every pair once, and ``runner``
judges the scored streams under several policies through the breaker's in-memory store:
no broker, no Redis, no side effects.
"""

from quantdrift.evaluation.cache import ScoreCache, to_score
from quantdrift.evaluation.calibration import floor_seed
from quantdrift.evaluation.long import LongResult, format_long, poisson_upper95, run_long
from quantdrift.evaluation.runner import (
    STANDARD_POLICIES,
    PolicyResult,
    RouteResult,
    evaluate,
    format_table,
    standard_policies,
)
from quantdrift.evaluation.streams import EvalPlan, RouteStream, build_plan

__all__ = [
    "STANDARD_POLICIES",
    "EvalPlan",
    "LongResult",
    "PolicyResult",
    "RouteResult",
    "RouteStream",
    "ScoreCache",
    "build_plan",
    "evaluate",
    "floor_seed",
    "format_long",
    "format_table",
    "poisson_upper95",
    "run_long",
    "standard_policies",
    "to_score",
]
