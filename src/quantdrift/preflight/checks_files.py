"""The static checks: files in, an Item out (calibration-leakage, salient-weights,
fp8-scales, memory-utilization)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from quantdrift.errors import ConfigError
from quantdrift.preflight import leakage, weights
from quantdrift.preflight.context import Context
from quantdrift.preflight.report import Item, judged, skipped

LEAKAGE = "calibration-leakage"
SALIENT = "salient-weights"
SCALES = "fp8-scales"
MEMORY = "memory-utilization"
TITLES = {
    LEAKAGE: "Calibration set does not overlap the evaluation set",
    SALIENT: "Salient channels protected (embeddings, lm_head, outlier layers)",
    SCALES: "Every scale tensor in [1e-4, 1e4], none zero/NaN/Inf",
    MEMORY: "gpu_memory_utilization in [0.90, 0.92]",
}


async def calibration_leakage(ctx: Context) -> Item:
    c = ctx.config.calibration_leakage
    if c.calibration is None or c.evaluation is None:
        return skipped(
            LEAKAGE,
            TITLES[LEAKAGE],
            "set calibration_leakage.calibration and .evaluation (JSONL, JSON or text)",
        )
    t = leakage.LeakageThresholds(
        n_words=c.n_words,
        n_cjk=c.n_cjk,
        item_overlap=c.item_overlap,
        near_duplicate=c.near_duplicate,
        min_items_per_domain=c.min_items_per_domain,
    )
    calib, evals = leakage.load_texts(c.calibration), leakage.load_texts(c.evaluation)
    ctx.progress(f"{LEAKAGE}: {len(calib)} calibration x {len(evals)} evaluation items")
    r = leakage.measure(calib, evals, c.domains, t)
    ok, why = leakage.leakage_ok(r, t)
    return judged(
        LEAKAGE,
        TITLES[LEAKAGE],
        ok,
        {
            "ngram_overlap": round(r.ngram_overlap, 4),
            "contaminated_items": len(r.contaminated),
            "near_duplicates": len(r.near_duplicates),
            "exact_duplicates": r.exact_duplicates,
            "domain_coverage": r.coverage,
        },
        {
            "item_overlap": t.item_overlap,
            "max_contaminated": t.max_contaminated,
            "near_duplicate_jaccard": t.near_duplicate,
            "max_near_duplicates": t.max_near_duplicates,
            "min_items_per_domain": t.min_items_per_domain,
            "n_words": t.n_words,
            "n_cjk": t.n_cjk,
        },
        why=why,
        contaminated=r.contaminated[:20],
        near_duplicates_found=r.near_duplicates[:20],
        uncovered=r.uncovered,
        calibration_items=r.calibration_items,
        eval_items=r.eval_items,
    )


async def salient_weights(ctx: Context) -> Item:
    c = ctx.config.salient_weights
    if c.checkpoint is None:
        return skipped(
            SALIENT,
            TITLES[SALIENT],
            "set salient_weights.checkpoint (HF directory, .safetensors or .gguf)",
        )
    ctx.progress(f"{SALIENT}: inspecting {c.checkpoint}")
    insp = weights.inspect(c.checkpoint)
    r = weights.salient(insp, c.min_bits, c.outlier_layers, c.min_share_high_precision)
    return judged(
        SALIENT,
        TITLES[SALIENT],
        r.ok,
        r.measured,
        {
            "min_bits": c.min_bits,
            "min_share_high_precision": c.min_share_high_precision,
            "outlier_layers": c.outlier_layers or "first and last blocks' MLP down projections",
        },
        why=r.why,
        low_precision_protected=r.low,
        checkpoint=c.checkpoint.name,
    )


async def fp8_scales(ctx: Context) -> Item:
    c = ctx.config.fp8_scales
    ckpt = c.checkpoint or ctx.config.salient_weights.checkpoint
    title = f"Every scale tensor in [{c.lo:g}, {c.hi:g}], none zero/NaN/Inf"
    if ckpt is None:
        return skipped(SCALES, title, "set fp8_scales.checkpoint (safetensors file or directory)")
    if ckpt.suffix == ".gguf" or (ckpt.is_dir() and not list(ckpt.glob("*.safetensors"))):
        return skipped(
            SCALES,
            title,
            "GGUF keeps its block scales inside the quantized blocks: no scale tensors to scan",
        )
    ctx.progress(f"{SCALES}: scanning scale tensors in {ckpt}")
    stats = weights.scan_scales(ckpt, c.lo, c.hi)
    if not stats:
        return skipped(SCALES, title, "no scale tensors (*_scale, *.scales) in the checkpoint")
    bad = [s for s in stats if s.bad]
    finite_min = [s.min for s in stats if s.min is not None]
    finite_max = [s.max for s in stats if s.max is not None]
    measured = {
        "scale_tensors": len(stats),
        "values": sum(s.count for s in stats),
        "zeros": sum(s.zeros for s in stats),
        "nans": sum(s.nans for s in stats),
        "infs": sum(s.infs for s in stats),
        "below_range": sum(s.below for s in stats),
        "above_range": sum(s.above for s in stats),
        "min": min(finite_min) if finite_min else None,
        "max": max(finite_max) if finite_max else None,
    }
    why = (
        (
            f"{len(bad)} of {len(stats)} scale tensors out of range: "
            + ", ".join(s.name for s in bad[:5])
        )
        if bad
        else f"{len(stats)} scale tensors in range"
    )
    return judged(
        SCALES,
        title,
        not bad,
        measured,
        {"lo": c.lo, "hi": c.hi, "zero_nan_inf": 0},
        why=why,
        bad_tensors=[_stat(s) for s in bad[:50]],
    )


def _stat(s: weights.ScaleStats) -> dict[str, Any]:
    return {
        "name": s.name,
        "count": s.count,
        "zeros": s.zeros,
        "nans": s.nans,
        "infs": s.infs,
        "below": s.below,
        "above": s.above,
        "min": s.min,
        "max": s.max,
    }


_ARG = re.compile(r"--gpu[-_]memory[-_]utilization(?:=|\s+)([0-9.eE+-]+)")


def find_memory_utilization(text: str, suffix: str = "") -> float | None:
    """``gpu_memory_utilization`` from a vLLM YAML/JSON config or a command line.

    >>> find_memory_utilization("vllm serve m --gpu-memory-utilization 0.91 --port 8000")
    0.91
    >>> find_memory_utilization("gpu-memory-utilization: 0.95", ".yaml")
    0.95
    >>> find_memory_utilization("port: 8000", ".yaml") is None
    True
    """
    if suffix in (".yaml", ".yml", ".json"):
        try:
            data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"serving config: cannot parse: {exc}") from exc
        found = _find_key(data)
        if found is not None:
            return found
    m = _ARG.search(text)
    return float(m.group(1)) if m else None


def _find_key(data: Any) -> float | None:
    if isinstance(data, dict):
        for k, v in data.items():
            if str(k).replace("-", "_") == "gpu_memory_utilization" and isinstance(v, int | float):
                return float(v)
            inner = _find_key(v)
            if inner is not None:
                return inner
    elif isinstance(data, list):
        for v in data:
            inner = _find_key(v)
            if inner is not None:
                return inner
    elif isinstance(data, str):
        m = _ARG.search(data)
        if m:
            return float(m.group(1))
    return None


async def memory_utilization(ctx: Context) -> Item:
    c = ctx.config.memory_utilization
    title = f"gpu_memory_utilization in [{c.lo:.2f}, {c.hi:.2f}]"
    if c.serving_config is None:
        return skipped(
            MEMORY,
            title,
            "no serving config (memory_utilization.serving_config): a CPU server such as "
            "`quantdrift lab serve` has no gpu_memory_utilization",
        )
    path = Path(c.serving_config)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"serving config {path}: {exc.strerror or exc}") from exc
    value = find_memory_utilization(text, path.suffix)
    if value is None:
        return skipped(MEMORY, title, f"{path.name} does not set gpu_memory_utilization")
    ok = c.lo <= value <= c.hi
    why = f"gpu_memory_utilization {value:g}" + ("" if ok else f" outside [{c.lo}, {c.hi}]")
    return judged(
        MEMORY,
        title,
        ok,
        {"gpu_memory_utilization": value},
        {"lo": c.lo, "hi": c.hi},
        why=why,
        source=path.name,
    )
