"""Run the checklist: the checks in launch order, each turned into an Item, then the report.

Order matters: ``warmup`` measures a cold server, so it runs before the checks
that send model traffic. A check that raises a QuantdriftError (a file that is
not there, a broker that does not answer) becomes a ``fail`` with the message,
never a crash of the whole checklist: the report still says everything else.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from quantdrift.errors import QuantdriftError
from quantdrift.preflight import checks_files as files
from quantdrift.preflight import checks_gateway as gw
from quantdrift.preflight import checks_model as model
from quantdrift.preflight import drill, identity, load
from quantdrift.preflight.context import Check, Context
from quantdrift.preflight.report import Item, build_report

CHECKS: dict[str, tuple[str, Check]] = {
    files.LEAKAGE: (files.TITLES[files.LEAKAGE], files.calibration_leakage),
    files.SALIENT: (files.TITLES[files.SALIENT], files.salient_weights),
    files.SCALES: (files.TITLES[files.SCALES], files.fp8_scales),
    files.MEMORY: (files.TITLES[files.MEMORY], files.memory_utilization),
    gw.PROBES: (gw.TITLES[gw.PROBES], gw.probes),
    gw.SHADOW: (gw.TITLES[gw.SHADOW], gw.shadow_link),
    model.WARMUP: (model.TITLES[model.WARMUP], model.warmup),
    model.NIAH: (model.TITLES[model.NIAH], model.niah),
    model.PERPLEXITY: (model.TITLES[model.PERPLEXITY], model.perplexity),
    drill.DRILL: (drill.TITLE, drill.switch_drill),
    load.LOAD: (load.TITLE, load.load),
}
CHECK_IDS = tuple(CHECKS)


def select(only: Sequence[str] | None) -> list[str]:
    """The checks to run, in launch order; ValueError naming an unknown id."""
    if not only:
        return list(CHECK_IDS)
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check {', '.join(unknown)}; choose from {', '.join(CHECK_IDS)}")
    return [c for c in CHECK_IDS if c in only]


async def run_checks(ctx: Context, ids: Sequence[str]) -> list[Item]:
    items = []
    for n, cid in enumerate(ids, 1):
        title, fn = CHECKS[cid]
        ctx.progress(f"[{n}/{len(ids)}] {cid}: {title}")
        t0 = time.perf_counter()
        try:
            item = await fn(ctx)
        except (QuantdriftError, OSError, RuntimeError, ValueError, TimeoutError) as exc:
            # One check that cannot run must not hide the others' results.
            why = f"could not run: {exc}" if str(exc) else f"could not run: {exc!r}"
            item = Item(cid, title, "fail", {}, {}, {"why": why})
        item.evidence.setdefault("duration_s", round(time.perf_counter() - t0, 3))
        ctx.progress(
            f"[{n}/{len(ids)}] {cid}: {item.status}"
            + (
                f" ({item.evidence.get('why') or item.evidence.get('reason')})"
                if item.status != "pass"
                else ""
            )
        )
        items.append(item)
    return items


async def run(ctx: Context, only: Sequence[str] | None = None) -> dict[str, Any]:
    ids = select(only)
    cfg = ctx.config
    # Before the checks: the engines a report names are the ones that were measured.
    ident = await identity.subject_identity(cfg)
    items = await run_checks(ctx, ids)
    subject = {
        "candidate": cfg.candidate.url if cfg.candidate else None,
        "reference": cfg.reference.url if cfg.reference else None,
        "gateway": cfg.gateway_url,
        "gateway_config": cfg.gateway_config.name if cfg.gateway_config else None,
        "route": cfg.route,
        "checks": ids,
        **ident,
    }
    report = build_report(
        items,
        veto_checks=cfg.vetoes,
        waivers=cfg.waivers,
        subject=subject,
        generated_at=round(time.time(), 3),
    )
    report["signoff_policy"] = cfg.signoff.model_dump()
    return report
