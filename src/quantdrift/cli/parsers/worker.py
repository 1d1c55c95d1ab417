"""The flags of ``quantdrift worker`` (what it runs: ``quantdrift.cli.worker``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import (
    add_log_level,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="settings YAML (kafka:, redis:, ...; see docs/settings.md); QUANTDRIFT_* win over it",
    )
    add_log_level(p, "warning")
    p.add_argument("--web-port", type=int, default=None, help="status page port (0 = off)")
    p.set_defaults(func="run", service=True)
