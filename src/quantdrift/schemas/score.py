"""ScoreEvent: every metric of one pair and the per-pair verdict."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantdrift.schemas.base import SCHEMA_VERSION, Message, PairId, RouteName
from quantdrift.schemas.pair import PairKind, TagName, TagValue

Verdict = Literal["ok", "drift", "anomaly"]
PROMPT_EXCERPT_CHARS = 160


class Metrics(BaseModel):
    """All metrics of a pair; None where the inputs to compute one were absent."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)

    cosine: float | None = None
    cosine_tier: str | None = None
    bleu: float | None = None
    rouge1: float | None = None
    rougeL: float | None = None
    jaccard: float | None = None
    length_ratio: float | None = None
    first_divergence: int | None = None
    entropy_mean: float | None = None
    entropy_min: float | None = None
    entropy_shift: float | None = None
    kl: float | None = None
    flip_rate: float | None = None
    tf_gap: float | None = None
    # Teacher-forced divergence: mean over the candidate's tokens of its own log-prob
    # minus the reference's (one prefill on the reference): a path estimate of
    # KL(candidate || reference) in nats, measured on the same tokens, so sampling
    # noise and greedy near-ties do not move it.
    tf_kl: float | None = None
    repetition_run: int = 0
    looping: bool = False
    distinct_2: float | None = None
    whitespace_run: int = 0
    json_ok: bool | None = None
    json_error: str | None = None
    reference_json_ok: bool | None = None
    # Token counts (quantdrift.detectors.tokenize) and the reference's own
    # degeneration signals: a loop the reference also produces was asked for
    # ("repeat X ten times"), not caused by quantization, so the verdict compares.
    candidate_tokens: int | None = None
    reference_tokens: int | None = None
    reference_repetition_run: int | None = None
    reference_looping: bool | None = None
    reference_whitespace_run: int | None = None
    # Finished (not cut off at max_tokens) on each side; None when the gateway did not
    # say (finish_reason absent). A paired task outcome: see detectors/tolerance.py.
    finished: bool | None = None
    reference_finished: bool | None = None
    # Whether each side got a checkable task right (``RequestInfo.expected_answer``);
    # None when the pair carries no expected answer. A paired task outcome too.
    answer_ok: bool | None = None
    reference_answer_ok: bool | None = None


class DivergentToken(BaseModel):
    """Where a teacher-forced candidate first left the reference
    (``detectors/divergence.py`` has the definition and the privacy rule).

    ``position``: 0-based in the candidate's ``of`` answer tokens; ``token``: the
    candidate's token there (None on a private request); ``rank``: its 1-based rank
    under the reference (None when the server reported no ranks);
    ``reference_logprob`` / ``candidate_logprob``: its log-prob under each side;
    ``preferred``: the reference's top tokens there, best first; ``context``: the
    candidate's answer just before it, only where the pair carries its prompt in clear.
    """

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)

    position: int = Field(ge=0)
    of: int = Field(ge=1)
    token: str | None = Field(default=None, max_length=256)
    rank: int | None = Field(default=None, ge=1)
    reference_logprob: float
    candidate_logprob: float | None = None
    preferred: dict[str, float] = Field(default_factory=dict, max_length=20)
    context: str | None = Field(default=None, max_length=256)

    def line(self) -> str:
        """One line for an alert or a terminal.

        >>> DivergentToken(position=3, of=9, token=" Lyon", rank=7, reference_logprob=-6.2,
        ...                preferred={" Paris": -0.01}).line()
        "token 3/9 ' Lyon': reference rank 7, log-prob -6.20; it preferred ' Paris'"
        """
        token = "(private)" if self.token is None else repr(self.token)
        rank = "" if self.rank is None else f"reference rank {self.rank}, "
        line = f"token {self.position}/{self.of} {token}: {rank}log-prob "
        line += f"{self.reference_logprob:.2f}"
        if self.preferred:
            line += "; it preferred " + " | ".join(repr(t) for t in self.preferred)
        if self.context is not None:
            line += f"; after {self.context!r}"
        return line


class ScoreEvent(Message):
    """Published to ``quantdrift.scores.v1`` (key = route) by the score agent.

    On the topic it travels inside a ``SignedScore`` envelope (``schemas/signing.py``):
    the judge folds only scores a worker's key signed. ``scored_at`` is when the worker
    signed it; the judge refuses one older than its pair-id dedupe window, where a
    replayed genuine score could no longer be told from a new one.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    pair_id: PairId
    route: RouteName
    kind: PairKind
    ts: float
    # Unknown decoding counts as sampled, as in RequestInfo.decoding.
    decoding: Literal["greedy", "sampled"] = "sampled"
    candidate_precision: str = ""
    metrics: Metrics
    verdict: Verdict = "ok"
    reasons: list[str] = Field(default_factory=list)
    # A drift score against the route's noise floor (0 ~ noise); None before calibration.
    drift_score: float | None = None
    label: str | None = Field(default=None, max_length=64)
    scored_at: float | None = None
    # What served the candidate (``EngineInfo.identity``: engine/version/model). The
    # breaker restarts a route's evidence when it changes; None (older producers,
    # gateways that cannot tell) never counts as a change.
    candidate_engine: str | None = Field(default=None, max_length=700)
    # The pair's slice (``PairEvent.tags``), for the judge's per-slice tests.
    tags: dict[TagName, TagValue] = Field(default_factory=dict, max_length=16)
    # What an alert's worst pairs show about the pair: its prompt as the pair carried it
    # (the salted hash, or the first characters where the route sends prompts in clear)
    # and the first divergent token of a teacher-forced pair.
    prompt_hash: str | None = Field(default=None, max_length=128)
    prompt_excerpt: str | None = Field(default=None, max_length=PROMPT_EXCERPT_CHARS)
    divergence: DivergentToken | None = None
