"""Draw a report's launch page from disk: the report's bytes, its approvals, the key ring.

One path for every caller (``preflight`` after a run, ``preflight sign`` after an
approval, ``preflight page`` at any time), so the sign-off block always shows
the approvals that are on disk now, checked against the report's bytes now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantdrift.errors import ConfigError
from quantdrift.preflight.html import render
from quantdrift.preflight.signoff import Block, block, policy_of, read_approvals, trusted


def page_path(report: Path) -> Path:
    """Where a report's (or a certificate's) page goes by default: beside it, ``.html``
    for ``.json``."""
    return report.with_suffix(".html")


def draw(
    report: Path,
    out: Path,
    signing: Any,
    required: int | None = None,
    distinct_keys: bool | None = None,
) -> Block:
    """Write ``out``; the policy is the report's own unless given here."""
    try:
        raw = report.read_bytes()
    except OSError as exc:
        raise ConfigError(f"report {report}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"report {report}: not JSON") from exc
    if not isinstance(data, dict) or "items" not in data:
        raise ConfigError(f"report {report}: not a preflight report")
    want, distinct = policy_of(data)
    keys = trusted(signing)
    b = block(
        raw,
        read_approvals(report),
        keys,
        required=required or want,
        distinct_keys=distinct if distinct_keys is None else distinct_keys,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(data, b), encoding="utf-8")
    return b
