"""The flags of ``quantdrift verdict-api`` (what it runs: ``quantdrift.cli.verdict_api``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from quantdrift.cli.common import positive_int

if TYPE_CHECKING:
    pass


TOKEN_ENV = "QUANTDRIFT_VERDICT_API__TOKEN"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verdict-api")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--token-file", type=Path, help=f"bearer token file (else ${TOKEN_ENV})")
    p.add_argument(
        "--preflight",
        action="append",
        default=[],
        metavar="ROUTE=REPORT",
        help="the preflight report Flagger's pre-rollout hook requires for ROUTE (repeatable)",
    )
    p.add_argument(
        "--certificate",
        action="append",
        default=[],
        metavar="ROUTE=CERT",
        help="the quantization certificate a rollout of ROUTE starts from (repeatable)",
    )
    p.add_argument("--required-signers", type=positive_int, default=2)
    p.add_argument("--distinct-keys", action="store_true", help="signers must use distinct keys")
    p.add_argument("--public-url", default="", help="base URL for links in answers")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func="run")
