"""``quantdrift demo [--json]``: watch a quantized route get rolled back.

Exits 0 only if the rollback happened and the gateway's controller switched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from rich.console import Console
from rich.live import Live
from rich.table import Table

from quantdrift.cli.settings import load_settings
from quantdrift.demo.runner import DemoResult, run_demo
from quantdrift.demo.sources import demo_streams


def run(args: argparse.Namespace) -> int:
    if args.rate <= 0:
        raise SystemExit(f"quantdrift: error: --rate must be > 0, got {args.rate}")
    healthy, drifted, source, calibration = demo_streams(args.pairs, synthetic=args.synthetic)
    console = Console(stderr=args.json)
    state = {"phase": "starting", "sim": None, "verdict": "", "last": ""}

    def render(result: DemoResult) -> Table:
        t = Table(title=f"quantdrift demo — route cs-agent/int4 ({source})", show_header=False)
        t.add_row("phase", state["phase"])
        t.add_row("shadow pairs sent / scored", f"{result.pairs} / {result.scored}")
        sim = state["sim"]
        t.add_row("last similarity", "-" if sim is None else f"{sim:.3f} ({state['verdict']})")
        t.add_row("breaker", "OPEN: users on the reference" if result.rollback_pair else "closed")
        return t

    live = Live(render(DemoResult()), console=console, refresh_per_second=8, transient=False)

    def progress(result: DemoResult, score, message: str) -> None:  # type: ignore[no-untyped-def]
        if message:
            state["phase"] = message
        if score is not None and score.kind == "shadow":
            m = score.metrics
            state["sim"] = m.cosine if m.cosine is not None else m.rougeL
            state["verdict"] = score.verdict + (
                ": " + "; ".join(score.reasons) if score.reasons else ""
            )
        live.update(render(result))

    with live:
        result = asyncio.run(
            run_demo(
                load_settings(),
                healthy,
                drifted,
                healthy_pairs=args.healthy_pairs,
                rate_per_s=args.rate,
                progress=progress,
                calibration=calibration,
            )
        )
    summary = result.summary()
    if result.ok:
        console.print(
            f"[bold green]rolled back[/] at shadow pair {result.rollback_pair} "
            f"(drift began at {result.drift_onset_pair}) by rule {result.rule}; the controller "
            f"switched to {result.route_target_after!r} {result.switch_latency_ms} ms after the "
            "decisive pair was published"
        )
    else:
        console.print("[bold red]no rollback[/]: " + "; ".join(result.notes or ["see above"]))
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")
    return 0 if result.ok else 1
