"""``quantdrift eval --no-replay``: a recorded traffic corpus judged as an operator meets it.

The protocol is in :mod:`quantdrift.evaluation.corpus`; this is what the command line
and ``bench/eval_corpus.py`` share: read the pairs, strip them to a mode, build the
scorer the worker would use, and run one scenario.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from quantdrift.breaker.policy import load_policy
from quantdrift.config import EmbeddingSettings
from quantdrift.errors import ConfigError, InputError
from quantdrift.evaluation.answers import JoinCount, PromptAnswer, join_answers
from quantdrift.evaluation.cache import ScoreCache
from quantdrift.evaluation.corpus import (
    CorpusEval,
    Row,
    Scenario,
    by_prompt,
    complete,
    prompt_of,
)
from quantdrift.evaluation.modes import strip
from quantdrift.schemas import PairEvent
from quantdrift.services.pairs import read_pairs
from quantdrift.services.scoring import build_embedder

LogprobMode = Literal["full", "no-teacher-forcing", "none"]


@dataclass(frozen=True)
class CorpusRequest:
    pairs: Path
    healthy_label: str
    variants: tuple[str, ...]
    calibration_prompts: int = 300
    calibration_pool: int | None = None  # default: calibration_prompts
    draws: int = 200
    seed: int = 0
    logprobs: LogprobMode = "full"
    weights: Mapping[tuple[str, str], float] = field(default_factory=dict)
    confine: tuple[str, str] | None = None
    share: float = 0.1
    only: tuple[str, str] | None = None
    policy_file: Path | None = None
    embedder: str | None = None
    # Each prompt's checkable answer by prompt id (``lab.corpus.build.answers`` of the
    # corpus's prompts file): joined to the pairs recorded without one.
    answers: Mapping[str, PromptAnswer] = field(default_factory=dict)

    def scenario(self) -> Scenario:
        return Scenario(
            name=scenario_name(self.weights, self.confine, self.share, self.only),
            weights=dict(self.weights),
            confine=self.confine,
            share=self.share,
            only=self.only,
        )


def scenario_name(
    weights: Mapping[tuple[str, str], float],
    confine: tuple[str, str] | None,
    share: float,
    only: tuple[str, str] | None,
) -> str:
    """``healthy mix``, ``mix task=code x3``, ``confined language=zh @10%``, ``slice ...``.

    >>> scenario_name({("task", "code"): 3.0}, None, 0.1, None)
    'mix task=code x3'
    """
    if only is not None:
        return f"slice {only[0]}={only[1]}"
    if confine is not None:
        return f"confined {confine[0]}={confine[1]} @{share:.0%}"
    if weights:
        return "mix " + ", ".join(f"{d}={v} x{w:g}" for (d, v), w in weights.items())
    return "traffic mix"


def load(
    embedding: EmbeddingSettings,
    request: CorpusRequest,
    progress: Callable[..., None] | None = None,
) -> CorpusEval:
    """Read, strip, score: the evaluation every scenario of one mode runs on."""
    if not request.pairs.exists():
        raise InputError(f"no such file or folder: {request.pairs}")
    pairs = [strip(p, request.logprobs) for p in read_pairs(request.pairs)]
    joined = JoinCount()
    if request.answers:
        try:
            pairs, joined = join_answers(pairs, request.answers, prompt_of)
        except ValueError as exc:
            raise InputError(f"{request.pairs}: {exc}") from exc
    policy = load_policy(request.policy_file)
    embedder, _ = build_embedder(embedding, request.embedder)
    cache = ScoreCache(embedder, progress=progress)
    try:
        ev = CorpusEval.build(
            pairs,
            request.healthy_label,
            request.variants,
            cache,
            policy,
            calibration_pool=request.calibration_pool or request.calibration_prompts,
            seed=request.seed,
        )
    except ValueError as exc:
        raise InputError(f"{request.pairs}: {exc}") from exc
    ev.joined = joined
    return ev


def run(ev: CorpusEval, request: CorpusRequest) -> list[Row]:
    try:
        return ev.run(
            request.scenario(),
            request.variants,
            request.calibration_prompts,
            request.draws,
            request.seed,
            request.logprobs,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from exc


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [r.as_dict() for r in rows]


def corpus_slice(
    pairs: Sequence[PairEvent], labels: Sequence[str], prompts: int, seed: int
) -> list[PairEvent]:
    """A seeded sample of ``prompts`` corpus prompts that have a noise pair and a pair of
    every label, with just those pairs, in the corpus's order: a small set that keeps the
    corpus's mix of tasks, languages and lengths (what the demo and small tests read)."""
    grouped = by_prompt(pairs)
    full = complete(grouped, labels)
    if len(full) < prompts:
        raise ConfigError(
            f"{prompts} prompts asked for, but only {len(full)} have a noise pair and "
            f"{', '.join(labels)}"
        )
    picked = set(np.random.default_rng([seed, 11]).permutation(full)[:prompts].tolist())
    keep = {"noise", *labels}
    return [p for p in pairs if prompt_of(p) in picked and (p.label or "") in keep]
