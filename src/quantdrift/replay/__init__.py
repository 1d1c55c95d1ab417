"""Replay: re-score a topic range or an archive under any policy, with no side effects.

``core`` (pure: re-scoring, the fold through the in-memory store, the report's numbers),
``render`` (HTML with inline SVG, CSV, Parquet), ``sources`` (files, archive,
topic ranges), ``archive`` (the archive sink ``quantdrift archive`` runs).
"""

from quantdrift.replay.core import (
    HEALTHY_LABELS,
    ReplayReport,
    RouteReport,
    TripRow,
    build_report,
    quantiles,
    rescore,
    rescore_stream,
    score_rows,
)

__all__ = [
    "HEALTHY_LABELS",
    "ReplayReport",
    "RouteReport",
    "TripRow",
    "build_report",
    "quantiles",
    "rescore",
    "rescore_stream",
    "score_rows",
]
