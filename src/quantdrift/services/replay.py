"""Replay orchestration: read pairs (files, archive or a topic range), score them as the
worker does, fold them through the breaker's in-memory store, write the report.

No side effects on the guard: its own group-less consumer (never commits), an
in-memory store, no commands published, no alerts sent. The scorer comes from the worker's
factory and settings (:func:`quantdrift.services.scoring.build_embedder`), and each
batch is scored through ``embedding.score_with`` as the score agent does, so a
replay with no ``embedder`` named reproduces the worker's decisions on the same pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdrift.breaker.policy import load_policy
from quantdrift.config import Settings
from quantdrift.detectors import verdict
from quantdrift.errors import InputError
from quantdrift.replay import ReplayReport, build_report, render, rescore_stream, score_rows
from quantdrift.replay import sources as src
from quantdrift.schemas import ScoreEvent
from quantdrift.services.pairs import read_topic
from quantdrift.services.scoring import build_embedder

# progress(desc=..., total=..., advance=...): a bar, or a no-op.
Progress = Callable[..., None]


def _no_progress(**_: Any) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """What to replay and how. Exactly one of ``inputs``, ``archive`` or ``topic``.

    ``topic`` "" is the settings' pairs topic; ``embedder`` None is the worker's tier.
    """

    inputs: tuple[Path, ...] = ()
    archive: Path | None = None
    archive_topic: str | None = None
    topic: str | None = None
    since: float | None = None
    until: float | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    partitions: tuple[int, ...] | None = None
    policy: Path | None = None
    embedder: str | None = None
    out: Path = Path("replay-report")
    parquet: bool = True
    batch: int = 64
    worst: int = 10
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError("--batch must be >= 1")


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """What a replay produced: the scores in order, the report, and where files went."""

    source: str
    scores: list[ScoreEvent]
    report: ReplayReport
    pairs_rescored: int
    scores_rejudged: int
    skipped: int
    tier: str
    parquet_note: str
    parquet_missing: bool

    def summary(self, out: Path) -> dict[str, Any]:
        """The JSON summary ``quantdrift replay --json`` prints."""
        return {
            "source": self.source,
            "scorer": self.tier,
            "pairs_rescored": self.pairs_rescored,
            "scores_rejudged": self.scores_rejudged,
            "skipped": self.skipped,
            "out": str(out),
            "parquet": self.parquet_note,
            "routes": {
                route: {
                    "shadow_pairs": r.shadow_pairs,
                    "noise_pairs": r.noise_pairs,
                    "false_rollbacks": r.false_rollbacks,
                    "trips": [
                        {"index": t.index, "pair_id": t.pair_id, "rule": t.rule, "to": t.to_state}
                        for t in r.trips
                    ],
                }
                for route, r in self.report.routes.items()
            },
        }


def read_lines(
    settings: Settings, req: ReplayRequest, progress: Progress = _no_progress
) -> tuple[list[bytes], str]:
    """The raw records to replay, and a one-line description of where they came from."""
    if req.inputs:
        lines = [ln for path in req.inputs for ln in src.file_lines(path)]
        return lines, ", ".join(map(str, req.inputs))
    if req.archive is not None:
        topic = req.archive_topic or settings.kafka.topics.pairs
        lines = list(src.archive_lines(req.archive, topic, req.since, req.until))
        return lines, f"archive {req.archive} topic={topic}"
    rng = src.TopicRange(req.from_offset, req.to_offset, req.since, req.until, req.partitions)
    return read_topic(settings, req.topic, rng, timeout=req.timeout, progress=progress)


def run_replay(
    settings: Settings, req: ReplayRequest, progress: Progress = _no_progress
) -> ReplayOutcome:
    """Read, re-score, re-judge and write ``report.html``, ``scores.csv`` (and Parquet)."""
    policy = load_policy(req.policy or settings.policy_file)
    lines, source = read_lines(settings, req, progress)
    records = src.split_records(lines, req.since, req.until)
    if not records.pairs and not records.scores:
        # An empty report would read as "no trips": say there was nothing to judge.
        why = f"{len(records.skipped)} unreadable records" if records.skipped else "no records"
        raise InputError(f"nothing to replay from {source}: {why} in the range")
    embedder, tier = None, req.embedder or settings.embedding.tier
    if records.pairs:  # no pairs, no model to load
        embedder, tier = build_embedder(settings.embedding, req.embedder)
    progress(desc="score", total=len(records.pairs))
    scores = rescore_stream(
        records.pairs,
        embedder,
        policy,
        batch=req.batch,
        progress=lambda n: progress(desc="score", advance=n),
    )
    # Recorded scores are re-judged: the verdict follows this policy's thresholds.
    for s in records.scores:
        v, reasons = verdict(s.metrics, policy.thresholds(s.route))
        scores.append(s.model_copy(update={"verdict": v, "reasons": reasons}))
    report = build_report(scores, policy, worst_n=req.worst, source=source)
    req.out.mkdir(parents=True, exist_ok=True)
    rows = score_rows(scores)
    (req.out / "report.html").write_text(render.render_html(report), encoding="utf-8")
    render.write_csv(rows, req.out / "scores.csv")
    parquet_note, missing = "skipped (--no-parquet)", False
    if req.parquet:
        if render.parquet_available():
            render.write_parquet(rows, req.out / "scores.parquet")
            parquet_note = str(req.out / "scores.parquet")
        else:
            parquet_note = (
                "NOT written: pyarrow is not installed (pip install 'quantdrift[report]')"
            )
            missing = True
    return ReplayOutcome(
        source=source,
        scores=scores,
        report=report,
        pairs_rescored=len(records.pairs),
        scores_rejudged=len(records.scores),
        skipped=len(records.skipped),
        tier=tier,
        parquet_note=parquet_note,
        parquet_missing=missing,
    )
