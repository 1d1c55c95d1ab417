"""``quantdrift eval``'s job: read the labelled pairs, score each once, judge them offline.

The CLI parses and prints; this loads the files as the request says (labels,
decoding, log-prob stripping, the lab's prompt split), builds the worker's scorer,
and runs either the per-route evaluation (:mod:`quantdrift.evaluation.runner`) or
seeded long streams (:mod:`quantdrift.evaluation.long`). Nothing leaves the
process: the judge is the in-memory store behind the ``BreakerStore`` protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from quantdrift.breaker.policy import Policy, load_policy
from quantdrift.config import EmbeddingSettings
from quantdrift.errors import InputError
from quantdrift.evaluation import (
    ScoreCache,
    build_plan,
    evaluate,
    format_table,
    standard_policies,
)
from quantdrift.evaluation.calibration import seed_from_pairs
from quantdrift.evaluation.long import ROUTE, format_long, run_long
from quantdrift.evaluation.modes import select, strip
from quantdrift.schemas import PairEvent
from quantdrift.services.pairs import read_pairs
from quantdrift.services.scoring import build_embedder

Labels = tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class EvalRequest:
    """Everything ``quantdrift eval`` was asked, as plain values."""

    healthy: Path
    drifted: Path | None = None
    calibrate: Path | None = None
    healthy_labels: Labels = None
    drifted_labels: Labels = None
    blessed_labels: Labels = None
    policy_file: Path | None = None
    policies: tuple[str, ...] = ("default", "seeds")
    embedder: str | None = None
    decoding: Literal["any", "greedy", "sampled"] = "any"
    logprobs: Literal["full", "no-teacher-forcing", "none"] = "full"
    holdout: bool = False
    streams: int | None = None
    length: int = 5000
    drift_length: int = 200
    seed: int = 0
    calibration_draws: int = 1
    repeat: int = 1
    noise_as_shadow: bool = False
    pair_interval_s: float = 1.0


@dataclass(frozen=True, slots=True)
class EvalOutcome:
    """What to print: one JSON object per row, the human table and its footer, notes."""

    rows: list[dict[str, Any]]
    table: str
    footer: str
    notes: Sequence[str] = field(default_factory=tuple)


def run_eval(
    embedding: EmbeddingSettings,
    request: EvalRequest,
    progress: Callable[..., None] | None = None,
) -> EvalOutcome:
    """Evaluate as ``request`` says; an InputError for what cannot be evaluated."""
    for path in (request.healthy, request.drifted, request.calibrate, request.policy_file):
        if path is not None and not path.exists():
            raise InputError(f"no such file: {path}")
    if request.pair_interval_s <= 0:
        raise InputError(f"--pair-interval-s must be > 0, got {request.pair_interval_s}")
    if request.calibration_draws > 1 and (request.streams is None or request.calibrate is None):
        raise InputError("--calibration-draws needs --streams and --calibrate")
    policy = load_policy(request.policy_file)
    policies = {k: v for k, v in standard_policies(policy).items() if k in request.policies}
    part = "evaluation" if request.holdout else None
    healthy = _load(request, request.healthy, request.healthy_labels, part)
    drifted = _load(request, request.drifted, request.drifted_labels, part)
    calibrate = _load(request, request.calibrate, None, "calibration" if request.holdout else None)
    if not healthy:
        raise InputError(
            f"{request.healthy}: no pairs (after --healthy-label / --decoding / --holdout)"
        )
    embedder, tier = build_embedder(embedding, request.embedder)
    cache = ScoreCache(embedder, progress=progress)
    if request.streams is not None:
        return _long(request, healthy, drifted, calibrate, cache, policies, tier)
    plan = build_plan(
        healthy, drifted, calibrate, repeat=request.repeat, noise_as_shadow=request.noise_as_shadow
    )
    if not plan.streams:
        raise InputError(f"{request.healthy}: no shadow pairs to judge (try --noise-as-shadow)")
    results = evaluate(plan, cache, policies, pair_interval_s=request.pair_interval_s)
    rate = cache.pairs_per_s
    footer = (
        f"scoring: {cache.scored} pairs once, "
        f"{'-' if rate is None else f'{rate:.0f}'} pairs/s ({tier})"
    )
    return EvalOutcome([r.as_dict() for r in results], format_table(results), footer, plan.notes)


def calibration_draws(
    calibrate: Sequence[PairEvent], streamed: Sequence[PairEvent], draws: int, seed: int
) -> list[list[PairEvent]]:
    """``draws`` seeded resamples of the calibration, each on prompts no stream uses.

    A draw is a bootstrap over the calibration's prompts (with replacement, as many
    as there are): every pair of a drawn prompt, noise and blessed alike, once per
    time the prompt was drawn. Prompts that any streamed pair carries are left out
    first, so a floor is never fitted on the prompts it then judges. Seeded by
    ``(seed, draw)``: the same request draws the same calibrations.
    """
    by_prompt = calibration_prompts(calibrate, streamed)
    prompts = list(by_prompt)
    if not prompts:
        raise InputError("--calibration-draws: no calibration prompt that the streams do not use")
    out = []
    for d in range(draws):
        rng = np.random.default_rng([seed, d])
        picked = rng.integers(0, len(prompts), size=len(prompts))
        out.append([p for i in picked for p in by_prompt[prompts[int(i)]]])
    return out


def calibration_prompts(
    calibrate: Sequence[PairEvent], streamed: Sequence[PairEvent]
) -> dict[tuple[str | None, str | None], list[PairEvent]]:
    """The calibration's pairs by prompt (its hash and text), in file order, leaving out
    every prompt a streamed pair carries: what a draw of the calibration picks from."""
    streamed_keys = {_prompt_key(p) for p in streamed}
    by_prompt: dict[tuple[str | None, str | None], list[PairEvent]] = {}
    for p in calibrate:
        if _prompt_key(p) not in streamed_keys:
            by_prompt.setdefault(_prompt_key(p), []).append(p)
    return by_prompt


def _prompt_key(p: PairEvent) -> tuple[str | None, str | None]:
    return p.request.prompt_hash, p.request.prompt


def _load(
    request: EvalRequest, path: Path | None, labels: Labels, part: str | None
) -> list[PairEvent]:
    if path is None:
        return []
    pairs = select(read_pairs(path), labels=labels, decoding=request.decoding, part=part)  # type: ignore[arg-type]
    return [strip(p, request.logprobs) for p in pairs]


def _long(
    request: EvalRequest,
    healthy: list[PairEvent],
    drifted: list[PairEvent],
    calibrate: list[PairEvent],
    cache: ScoreCache,
    policies: dict[str, Policy],
    tier: str,
) -> EvalOutcome:
    shadow_h = [p for p in healthy if p.kind == "shadow"]
    shadow_d = [p for p in drifted if p.kind == "shadow"]
    labels = request.blessed_labels
    rp = policies["default"].for_route(ROUTE)
    # (pairs whose noise pairs seed the floor, pairs whose blessed ones do), per draw.
    if request.calibration_draws == 1:
        calibrations = [([*calibrate, *healthy, *drifted], calibrate)]
    else:
        draws = calibration_draws(
            calibrate, [*shadow_h, *shadow_d], request.calibration_draws, request.seed
        )
        calibrations = [(pairs, pairs) for pairs in draws]
    floors: list[dict[str, list[dict[str, float]]]] = []
    sources: list[dict[str, str]] = []
    for noise_from, blessed_from in calibrations:
        floor_pairs = [p for p in noise_from if p.kind == "noise"]
        blessed = select(blessed_from, labels=labels, kinds=("shadow",)) if labels else []
        cache.fill([*floor_pairs, *blessed])
        seed_rows, source = seed_from_pairs(floor_pairs, blessed, cache, rp, ROUTE)
        floors.append(seed_rows)
        sources.append(source)
    source = sources[0]
    if not shadow_h:
        raise InputError("no healthy shadow pairs to resample")
    # Several --drifted-label values: one drifted pool (and one row per policy) each.
    drifted_labels = request.drifted_labels or ("drifted",)
    if len(drifted_labels) == 1:
        pools = {drifted_labels[0]: shadow_d}
    else:
        pools = {label: select(shadow_d, labels=(label,)) for label in drifted_labels}
    results = run_long(
        shadow_h,
        pools,
        floors[0] if len(floors) == 1 else floors,
        cache,
        policies,
        streams=request.streams or 1,
        length=request.length,
        seed=request.seed,
        drift_length=request.drift_length,
        pair_interval_s=request.pair_interval_s,
        floor_source=source,
    )
    context: dict[str, object] = {
        "embedder": tier,
        "decoding": request.decoding,
        "logprobs": request.logprobs,
        "holdout": request.holdout,
        "distinct_healthy": len(shadow_h),
        "distinct_drifted": {k: len(v) for k, v in pools.items()},
    }
    if len(floors) > 1:
        # Only with draws: one calibration keeps today's output byte for byte.
        context["calibration_draws"] = len(floors)
        context["calibration_sources"] = sources
    footer = (
        f"{len(shadow_h)} distinct healthy / {len(shadow_d)} drifted pairs; "
        f"scoring: {cache.scored} pairs once ({tier}); floors: {source}"
    )
    notes = repeats_note(shadow_h, request.length)
    return EvalOutcome(
        [{**r.as_dict(), **context} for r in results], format_long(results), footer, notes
    )


def repeats_note(healthy: Sequence[PairEvent], length: int) -> tuple[str, ...]:
    """Say so when a stream must replay its healthy pairs: its rates are then about them.

    A stream of ``length`` pairs drawn from fewer distinct pairs repeats them, and a
    greedy pair repeats its prompt's answer exactly; a false rollback per 100k then
    says how often these few prompts' mean outruns the null, not how 100k pairs of
    fresh prompts would fare. An analyst reading the rate needs that beside it.

    >>> repeats_note([], 10)
    ()
    """
    distinct = len(healthy)
    if distinct == 0 or length <= distinct:
        return ()
    prompts = len({_prompt_key(p) for p in healthy})
    return (
        f"each stream of {length:,} pairs replays {distinct} distinct healthy pairs "
        f"({prompts} prompts), each about {length / distinct:.0f} times: a false-rollback "
        "rate here measures how often these prompts' mean outruns the null, not how "
        "fresh traffic would fare; read it with the streams it happened in "
        "(--json: streams_with_false_rollback)",
    )
