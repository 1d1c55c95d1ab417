"""Streams over a traffic corpus, as an operator would meet them: no prompt replayed.

A corpus (``quantdrift lab corpus``) holds, for every prompt, one noise pair (the
reference against itself) and one shadow pair per candidate, all on the same prompt.
The evaluation here differs from the resampled long streams (``evaluation/long.py``)
in what a stream is made of:

* **No replay.** The prompts are split once, by a seeded shuffle, into a calibration
  pool and an evaluation pool. A stream is an ordering of evaluation prompts, each at
  most once; the healthy candidate's pair of each prompt in turn.
* **Calibration drawn apart, many times.** Each draw takes ``calibration_prompts``
  prompts from the calibration pool (without replacement): their noise pairs seed the
  floors and their healthy-candidate pairs the blessed baseline, as ``quantdrift
  calibrate`` would. Every draw judges a stream of its own, so a false rollback that only
  an unlucky calibration causes is counted.
* **Onset at a random point.** A broken variant takes over at a seeded random place in
  the first half of the stream; from there on each prompt brings the variant's pair. The
  delay counts route pairs from the onset up to and including the pair that opened the
  route; a stream that ends first is a miss.
* **Mix shift.** ``weights`` multiply a prompt's chance by its tags (``task=code: 3``):
  the stream is a weighted draw without replacement of half the evaluation prompts, so
  its mix differs from the calibration's.
* **Slice-confined drift.** ``confine=("language", "zh")`` with ``share=0.1``: the
  slice makes up that share of the stream, and only the slice's prompts switch to the
  variant at the onset (the rest stay healthy). Delays are reported in route pairs and
  in the slice's own pairs.

The decision is the production one (:class:`~quantdrift.breaker.offline.StreamFold`
over the in-memory store), one pair per simulated second, as in ``long.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.offline import StreamFold, offline_store
from quantdrift.breaker.policy import Policy
from quantdrift.evaluation.answers import Correctness, JoinCount, tally
from quantdrift.evaluation.cache import ScoreCache, to_score
from quantdrift.evaluation.calibration import seed_from_pairs
from quantdrift.evaluation.limit import information_limit
from quantdrift.evaluation.long import cell, forked, poisson_upper95, quantile
from quantdrift.evaluation.table import text_table
from quantdrift.schemas import PairEvent, ScoreEvent

ROUTE = "eval/corpus"
NOISE = "noise"


@dataclass(frozen=True, slots=True)
class CorpusPrompt:
    """One prompt's pairs: its tags, its noise pair, its shadow pairs by label."""

    prompt_id: str
    tags: Mapping[str, str]
    noise: PairEvent | None
    shadow: Mapping[str, PairEvent]


def prompt_of(pair: PairEvent) -> str:
    """The corpus prompt a pair belongs to: its id without the ``-{label}`` tail."""
    label = pair.label or ""
    tail = f"-{label}"
    return pair.pair_id[: -len(tail)] if label and pair.pair_id.endswith(tail) else pair.pair_id


def by_prompt(pairs: Sequence[PairEvent]) -> dict[str, CorpusPrompt]:
    """Group a corpus's pairs by prompt, in first-seen order."""
    tags: dict[str, Mapping[str, str]] = {}
    noise: dict[str, PairEvent] = {}
    shadow: dict[str, dict[str, PairEvent]] = {}
    for p in pairs:
        pid = prompt_of(p)
        tags.setdefault(pid, p.tags)
        if p.kind == "noise":
            noise[pid] = p
        else:
            shadow.setdefault(pid, {})[p.label or ""] = p
    return {pid: CorpusPrompt(pid, tags[pid], noise.get(pid), shadow.get(pid, {})) for pid in tags}


def complete(grouped: Mapping[str, CorpusPrompt], labels: Sequence[str]) -> list[str]:
    """The prompts that have a noise pair and a shadow pair of every label: the ones a
    stream can take (what the evaluation keeps, and what a bench sizes its pool by)."""
    return [
        pid
        for pid, p in grouped.items()
        if p.noise is not None and all(label in p.shadow for label in labels)
    ]


def split(prompts: Sequence[str], calibration_pool: int, seed: int) -> tuple[list[str], list[str]]:
    """(calibration pool, evaluation pool): a seeded shuffle, cut once. Disjoint.

    >>> cal, ev = split([f"p{i}" for i in range(10)], 3, seed=0)
    >>> len(cal), len(ev), set(cal) & set(ev)
    (3, 7, set())
    """
    order = list(prompts)
    np.random.default_rng([seed, 7]).shuffle(order)
    return order[:calibration_pool], order[calibration_pool:]


def weight_of(tags: Mapping[str, str], weights: Mapping[tuple[str, str], float]) -> float:
    """A prompt's weight in a mix: the product of its tags' multipliers (1 if none).

    >>> weight_of({"task": "code", "language": "zh"}, {("task", "code"): 3.0})
    3.0
    """
    w = 1.0
    for (dim, value), m in weights.items():
        if tags.get(dim) == value:
            w *= m
    return w


def weighted_order(weights: Sequence[float], length: int, rng: np.random.Generator) -> list[int]:
    """``length`` distinct indices, a weighted draw without replacement (Efraimidis-
    Spirakis keys ``u ** (1 / w)``: the next index is drawn in proportion to its weight
    among those left). Zero weights are never drawn."""
    w = np.asarray(weights, dtype=float)
    u = rng.random(len(w))
    keys = np.where(w > 0, np.log(np.maximum(u, 1e-300)) / np.where(w > 0, w, 1.0), -np.inf)
    order = np.argsort(-keys, kind="stable")
    live = [int(i) for i in order if w[i] > 0]
    return live[:length]


def confined_order(in_slice: Sequence[bool], share: float, rng: np.random.Generator) -> list[int]:
    """A shuffled stream in which the slice's prompts make up ``share`` of it: every
    prompt outside the slice once and as many slice prompts as the share asks (all of
    them, and fewer others, when the slice is too small)."""
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    inside = [i for i, s in enumerate(in_slice) if s]
    outside = [i for i, s in enumerate(in_slice) if not s]
    want = round(share / (1 - share) * len(outside))
    if want > len(inside):  # too few slice prompts: keep them all, take fewer others
        want = len(inside)
        outside = list(rng.permutation(outside)[: round(want * (1 - share) / share)])
    picked = [int(i) for i in rng.permutation(inside)[:want]] + [int(i) for i in outside]
    return [int(i) for i in rng.permutation(picked)]


@dataclass(frozen=True, slots=True)
class Scenario:
    """What a stream looks like: a mix (tag weights), a slice the drift is confined to."""

    name: str
    weights: Mapping[tuple[str, str], float] = field(default_factory=dict)
    confine: tuple[str, str] | None = None
    share: float = 0.1
    only: tuple[str, str] | None = None  # a route that carries one slice's traffic

    def order(self, prompts: Sequence[CorpusPrompt], rng: np.random.Generator) -> list[int]:
        if self.only is not None:
            dim, value = self.only
            idx = [i for i, p in enumerate(prompts) if p.tags.get(dim) == value]
            return [idx[int(i)] for i in rng.permutation(len(idx))]
        if self.confine is not None:
            dim, value = self.confine
            return confined_order([p.tags.get(dim) == value for p in prompts], self.share, rng)
        if self.weights:
            w = [weight_of(p.tags, self.weights) for p in prompts]
            return weighted_order(w, len(prompts) // 2, rng)
        return [int(i) for i in rng.permutation(len(prompts))]

    def drifts(self, p: CorpusPrompt) -> bool:
        """Whether the variant serves this prompt after the onset."""
        return self.confine is None or p.tags.get(self.confine[0]) == self.confine[1]


@dataclass
class Row:
    """One row of the table: a scenario, a variant, a calibration size, a mode."""

    scenario: str
    variant: str
    calibration_prompts: int
    mode: str
    streams: int
    healthy_pairs: int
    false_rollbacks: int
    false_rollbacks_per_100k: float
    false_rollbacks_per_100k_upper95: float
    streams_with_false_rollback: int
    delay_p50: float | None
    delay_p90: float | None
    missed: int
    limit: float | None
    slice_delay_p50: float | None = None
    slice_delay_p90: float | None = None
    distinct_eval_prompts: int = 0
    false_rollback_rules: dict[str, int] = field(default_factory=dict)
    detected_by: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class CorpusEval:
    """Everything a corpus's table is computed from, built once: prompts, scores, pools."""

    prompts: dict[str, CorpusPrompt]
    healthy: str
    cache: ScoreCache
    policy: Policy
    calibration_pool: list[str]
    eval_pool: list[str]
    interval_s: float = 1.0
    # What joining the prompts file's answers found (``evaluation.answers``); all zero
    # when no prompts file was given.
    joined: JoinCount = field(default_factory=JoinCount)

    @classmethod
    def build(
        cls,
        pairs: Sequence[PairEvent],
        healthy: str,
        variants: Sequence[str],
        cache: ScoreCache,
        policy: Policy,
        *,
        calibration_pool: int,
        seed: int,
    ) -> CorpusEval:
        """Keep the prompts that have a noise pair and a pair of every label asked for."""
        grouped = by_prompt(pairs)
        full = complete(grouped, [healthy, *variants])
        if len(full) <= calibration_pool:
            raise ValueError(
                f"{len(full)} complete prompts: too few for a calibration pool of "
                f"{calibration_pool} and any evaluation prompt"
            )
        cal, ev = split(full, calibration_pool, seed)
        kept = {pid: grouped[pid] for pid in full}
        every = [x for p in kept.values() for x in (p.noise, *p.shadow.values()) if x]
        cache.fill(every)
        return cls(kept, healthy, cache, policy, cal, ev)

    def score(self, pair: PairEvent) -> ScoreEvent:
        rp = self.policy.for_route(ROUTE)
        return to_score(pair, self.cache[pair], rp, ROUTE)

    async def floors(self, size: int, draw: int, seed: int) -> MemoryBreakerStore:
        """A store seeded as ``quantdrift calibrate`` would, from one draw of ``size``
        calibration prompts."""
        if size > len(self.calibration_pool):
            raise ValueError(f"calibration of {size} > pool of {len(self.calibration_pool)}")
        rng = np.random.default_rng([seed, draw, size, 1])
        picked = [
            self.calibration_pool[int(i)]
            for i in rng.permutation(len(self.calibration_pool))[:size]
        ]
        noise = [n for pid in picked if (n := self.prompts[pid].noise) is not None]
        blessed = [self.prompts[pid].shadow[self.healthy] for pid in picked]
        rp = self.policy.for_route(ROUTE)
        rows, _ = seed_from_pairs(noise, blessed, self.cache, rp, ROUTE)
        store = offline_store()
        for mode, r in rows.items():
            await store.seed_floor(ROUTE, mode, list(r))
        return store

    def correctness(self, variants: Sequence[str]) -> dict[str, Correctness]:
        """Per answer kind, over the evaluation prompts that have a checkable answer: how
        many, and how many the reference, the healthy candidate and each variant got
        right (the direction the outcome test judges, not only agreement)."""
        labels = [self.healthy, *variants]
        return tally(
            (
                p.shadow[self.healthy].request.answer_kind,
                self.cache[p.shadow[self.healthy]],
                {label: self.cache[p.shadow[label]] for label in labels},
            )
            for p in (self.prompts[pid] for pid in self.eval_pool)
        )

    def limit(self, variant: str, scenario: Scenario) -> float | None:
        """The information limit on these very pairs (healthy against the variant's,
        over the scenario's drifting prompts)."""
        ps = [self.prompts[pid] for pid in self.eval_pool if scenario.drifts(self.prompts[pid])]
        if not ps:
            return None
        h = [self.score(p.shadow[self.healthy]).metrics.model_dump() for p in ps]
        b = [self.score(p.shadow[variant]).metrics.model_dump() for p in ps]
        x = information_limit(h, b)
        return None if x is None or not np.isfinite(x) else round(x, 1)

    def run(
        self,
        scenario: Scenario,
        variants: Sequence[str],
        calibration_prompts: int,
        draws: int,
        seed: int,
        mode: str,
    ) -> list[Row]:
        """One row for the healthy stream alone (variant ``-``), one per variant."""
        return asyncio.run(
            self._run(scenario, list(variants), calibration_prompts, draws, seed, mode)
        )

    async def _run(
        self,
        scenario: Scenario,
        variants: list[str],
        calibration_prompts: int,
        draws: int,
        seed: int,
        mode: str,
    ) -> list[Row]:
        prompts = [self.prompts[pid] for pid in self.eval_pool]
        healthy_scores = [self.score(p.shadow[self.healthy]) for p in prompts]
        variant_scores = {v: [self.score(p.shadow[v]) for p in prompts] for v in variants}
        false = with_false = healthy_pairs = 0
        rules: dict[str, int] = {}
        delays: dict[str, list[float]] = {v: [] for v in variants}
        caught: dict[str, list[float]] = {v: [] for v in variants}
        slice_delays: dict[str, list[float]] = {v: [] for v in variants}
        missed = dict.fromkeys(variants, 0)
        by: dict[str, dict[str, int]] = {v: {} for v in variants}
        for d in range(draws):
            store = await self.floors(calibration_prompts, d, seed)
            rng = np.random.default_rng([seed, d, 2])
            order = scenario.order(prompts, rng)
            if not order:
                continue
            onset = int(rng.integers(0, max(1, len(order) // 2)))
            fold = StreamFold(store, self.policy)
            now, snapshot = 0.0, (fold, 0.0)
            fired: list[str] = []
            for n, i in enumerate(order):
                if n == onset:
                    snapshot = (forked(fold), now)
                now += self.interval_s
                score = healthy_scores[i].model_copy(update={"pair_id": f"{d}:h:{n}"})
                for trip in await fold.fold(score, now):
                    t = trip.transition
                    if t.to_state == "open" and t.from_state == "closed":
                        fired.append(t.rule)
            healthy_pairs += len(order)
            false += len(fired)
            with_false += bool(fired)
            for r in fired:
                rules[r] = rules.get(r, 0) + 1
            for v in variants:
                base, t0 = snapshot
                delay, in_slice, rule = await self._drift(
                    forked(base),
                    order[onset:],
                    prompts,
                    healthy_scores,
                    variant_scores[v],
                    scenario,
                    t0,
                    f"{d}:{v}:",
                )
                if delay is None:
                    missed[v] += 1
                    delays[v].append(float(len(order) - onset + 1))
                else:
                    delays[v].append(float(delay))
                    caught[v].append(float(delay))
                    slice_delays[v].append(float(in_slice))
                    by[v][rule] = by[v].get(rule, 0) + 1
        rows = []
        for v in ["-", *variants]:
            rows.append(
                Row(
                    scenario=scenario.name,
                    variant=v,
                    calibration_prompts=calibration_prompts,
                    mode=mode,
                    streams=draws,
                    healthy_pairs=healthy_pairs,
                    false_rollbacks=false,
                    false_rollbacks_per_100k=round(1e5 * false / max(healthy_pairs, 1), 3),
                    false_rollbacks_per_100k_upper95=round(
                        poisson_upper95(false, healthy_pairs), 3
                    ),
                    streams_with_false_rollback=with_false,
                    # The median over the streams that caught it; p90 counts a miss as
                    # one more pair than the stream had left, so a miss never helps.
                    delay_p50=quantile(caught.get(v, []), 0.5),
                    delay_p90=quantile(delays.get(v, []), 0.9),
                    missed=missed.get(v, 0),
                    limit=None if v == "-" else self.limit(v, scenario),
                    slice_delay_p50=quantile(slice_delays.get(v, []), 0.5),
                    slice_delay_p90=quantile(slice_delays.get(v, []), 0.9),
                    distinct_eval_prompts=len(prompts),
                    false_rollback_rules=dict(rules),
                    detected_by=by.get(v, {}),
                )
            )
        return rows

    async def _drift(
        self,
        fold: StreamFold,
        order: Sequence[int],
        prompts: Sequence[CorpusPrompt],
        healthy: Sequence[ScoreEvent],
        broken: Sequence[ScoreEvent],
        scenario: Scenario,
        now: float,
        prefix: str,
    ) -> tuple[int | None, int, str]:
        """(route pairs from the onset to the one that opened the route, the slice's
        pairs among them, the rule); (None, ., .) when the stream ends first."""
        if (await fold.state(ROUTE)).state != "closed":
            return 0, 0, "open at onset"
        in_slice = 0
        for n, i in enumerate(order, start=1):
            now += self.interval_s
            drifting = scenario.drifts(prompts[i])
            in_slice += drifting
            source = broken if drifting else healthy
            score = source[i].model_copy(update={"pair_id": f"{prefix}{n}"})
            for trip in await fold.fold(score, now):
                if trip.transition.to_state == "open":
                    return n, in_slice, trip.transition.rule
        return None, in_slice, ""


# (header, Row field) per column of ``quantdrift eval --no-replay``'s table.
CORPUS_COLUMNS = (
    "scenario",
    "variant",
    "streams",
    "healthy_pairs",
    "false_rollbacks",
    "delay_p50",
    "delay_p90",
    "missed",
    "limit",
    "slice_delay_p90",
)


def format_corpus(rows: Sequence[Row]) -> str:
    """A plain-text table, one row per scenario and variant (as ``long.format_long``)."""
    return text_table(
        list(CORPUS_COLUMNS), [[cell(getattr(r, c)) for c in CORPUS_COLUMNS] for r in rows]
    )
