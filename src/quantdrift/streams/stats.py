"""The worker's counters: what the status page and /metrics read, each said once here."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorkerStats:
    """Counters the status page and /metrics read, each said once here."""

    pairs_scored: int = 0
    """Pairs scored and sent on as signed scores."""
    dead_letters: int = 0
    """Records either agent sent to the DLQ (with the reason)."""
    scores_judged: int = 0
    """Scores the judge folded, duplicates included."""
    duplicates: int = 0
    """Scores the store had folded before: redeliveries, which change nothing."""
    scores_refused: int = 0
    """Score records not folded: unreadable, unsigned, forged or stale."""
    scoring_failures: int = 0
    """Pairs whose scoring raised even alone (dead-lettered)."""
    transitions: int = 0
    """Breaker transitions: each queued one command and one alert."""
    store_errors: int = 0
    """Times the breaker store was unavailable (each retried)."""
    batches: int = 0
    """Static scoring steps (up to ``ScoreLanes.stage_chunk`` pairs of an agent's batch);
    ``scoring_seconds`` holds the per-pair time of the last 2048."""
    scoring_seconds: list[float] = field(default_factory=list)
