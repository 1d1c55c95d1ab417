"""``quantdrift route status|rollback|restore|release --route R``: the one-click console.

A manual rollback or restore is signed like the breaker's commands, bumps the
route's epoch in the same atomic Redis step, and locks the route so the breaker
does not undo it; ``release`` hands the route back to the breaker.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from typing import TYPE_CHECKING, Any

from quantdrift.cli.settings import load_settings, signing_settings, with_stack
from quantdrift.errors import InputError
from quantdrift.schemas.certificate_live import evidence_lines
from quantdrift.services.console import manual_step, route_status

if TYPE_CHECKING:
    from quantdrift.config import Settings


def run(args: argparse.Namespace) -> int:
    if args.action != "status" and not args.route:
        raise InputError(f"route {args.action} needs --route")
    settings = signing_settings(with_stack(load_settings()))
    return asyncio.run(_run(settings, args))


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "status":
        rows = await route_status(settings, args.route)
        if args.json:
            print(json.dumps(rows))
        else:
            for r in rows:
                lock = " LOCKED" if r["locked"] else ""
                print(
                    f"{r['route']}: {r['state']}{lock} target={r['target'] or '-'} "
                    f"epoch={r['epoch']} pairs={r['pairs_seen']} last={r['last_decision']}"
                    f" armed={'yes' if r['armed'] else 'no'} ({r['reason']})"
                )
                for line in readiness_lines(r["rules"]):
                    print(f"  {line}")
                for line in slice_lines(r.get("slices") or []):
                    print(f"  {line}")
                for line in evidence_lines([{**r, "pairs": r["pairs_seen"]}]):
                    print(f"  {line}")
            if not rows:
                print("no routes yet")
        return 0
    step = await manual_step(settings, args.route, args.action, who=f"{getpass.getuser()}@cli")
    if step.warning:
        # stderr: stdout holds only the result (one JSON document with --json)
        sys.stderr.write(f"quantdrift: warning: {step.warning}\n")
    if args.json:
        s = step.state
        row = {
            "route": step.route,
            "action": step.action,
            "state": s.state,
            "target": s.target,
            "epoch": s.epoch,
            "locked": s.locked,
            "published": step.warning is None,
        }
        print(json.dumps(row))
    else:
        print(step.summary())
    return 0


def readiness_lines(rules: list[dict[str, Any]]) -> list[str]:
    """One line per test: ``tolerance:tf_kl  abstains  no floor: 0 of 10 ...``."""
    width = max((len(r["rule"]) for r in rules), default=0)
    lines = []
    for r in rules:
        status = "can fire" if r["status"] == "can_fire" else "abstains"
        note = "" if r["relied_on"] else " (not relied on)"
        why = f"  {'; '.join(r['reasons'])}" if r["reasons"] else ""
        lines.append(f"{r['rule']:<{width}}  {status}{note}{why}")
    return lines


def slice_lines(slices: list[dict[str, Any]]) -> list[str]:
    """One line per slice: ``slice language=zh  insufficient data: 3 of 20 pairs``."""
    width = max((len(r["slice"]) for r in slices), default=0)
    lines = []
    for r in slices:
        if r["status"] == "rolled_back":
            status = f"ROLLED BACK alone: its users on the reference (trips {r['trips']})"
        elif r["status"] == "half_open":
            status = "half-open alone: the reference serves it, the candidate in shadow"
        elif r["status"] == "insufficient_data":
            status = f"insufficient data: {r['pairs']} of {r['min_pairs']} pairs"
        else:
            status = f"testing: {r['pairs']} pairs"
        if r.get("early"):
            status += f" ({r['early']} crossed early)"
        lines.append(f"slice {r['slice']:<{width}}  {status}")
    return lines
