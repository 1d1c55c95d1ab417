"""PairEvent: one mirrored request, the candidate's and the reference's outputs."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from quantdrift.schemas.base import SCHEMA_VERSION, Message, PairId, RouteName

PairKind = Literal["shadow", "noise"]
PrecisionPreference = Literal["cost_optimized", "high_precision"]

# Generous bounds: a looping model runs to max_tokens, but 5 MB of text is an attack
# or a bug, and scoring it would stall a worker for every other route.
MAX_TEXT_CHARS = 200_000
MAX_TOKENS = 32_768
# The reference's alternatives per forced position: a handful is what an alert shows.
MAX_FORCED_TOP = 20


def pair_id_for(request_id: str, kind: str) -> str:
    """A mirrored request's pair id: the gateway's request id and the pair's kind.

    One formula, so the gateway's pairs and its traces name a pair alike.

    >>> pair_id_for("req-1", "shadow")
    'req-1:shadow'
    """
    return f"{request_id}:{kind}"


def decoding_of(temperature: Any) -> Literal["greedy", "sampled"]:
    """Greedy only when the request said temperature 0; sampled otherwise.

    Unknown (no temperature, or not a number) counts as sampled, everywhere: OpenAI-style
    servers default to T = 1, and judging a sampled pair against a greedy floor (or by
    absolute similarity) would call sampling noise drift.

    >>> decoding_of(0), decoding_of(0.0), decoding_of(0.7), decoding_of(None), decoding_of(False)
    ('greedy', 'greedy', 'sampled', 'sampled', 'sampled')
    """
    plain = isinstance(temperature, int | float) and not isinstance(temperature, bool)
    return "greedy" if plain and temperature == 0 else "sampled"


def _finite(values: list[float], name: str) -> list[float]:
    for v in values:
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite numbers")
    return values


def _finite_field(values: list[float], info: ValidationInfo) -> list[float]:
    return _finite(values, info.field_name or "values")


# Per-token numbers (log-probs, entropies): a NaN or an infinity would poison every
# mean the detectors take, so the type itself refuses them, wherever it is used.
FiniteFloats = Annotated[list[float], AfterValidator(_finite_field)]


class EngineInfo(BaseModel):
    """What served one side: a quality change follows an engine, version or weights change
    as surely as a new quantization. Optional and best effort (from ``GET /version``,
    ``GET /v1/models`` and the answer's ``system_fingerprint``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    engine: str | None = Field(default=None, max_length=64)
    version: str | None = Field(default=None, max_length=64)
    model: str | None = Field(default=None, max_length=512)
    system_fingerprint: str | None = Field(default=None, max_length=256)

    def identity(self) -> str | None:
        """Engine, version and weights as one short stable string; None when none is known.

        The breaker compares it between scores of a route: a new value means a new
        candidate, whose evidence starts over. ``system_fingerprint`` is left out on
        purpose: engines disagree on what it means (OpenAI's changes with backend
        configuration that is not a new model, some servers vary it between replicas
        or batches, vLLM often sends none), so it would restart the evidence of a
        candidate that did not change. What it misses, a restart under the same
        engine, version and weights, serves the same model.

        >>> EngineInfo(engine="vllm", version="0.6.3", model="llama-8b-w4a16").identity()
        'vllm/0.6.3/llama-8b-w4a16'
        >>> EngineInfo(engine="vllm").identity()
        'vllm/?/?'
        >>> EngineInfo(system_fingerprint="fp_1").identity() is None
        True
        """
        parts = (self.engine, self.version, self.model)
        if not any(parts):
            return None
        return "/".join(p or "?" for p in parts)


class ToolCall(BaseModel):
    """A function call one side answered with (OpenAI's ``tool_calls[].function``): its
    name and its arguments as the model wrote them. The arguments stay text: a call
    whose arguments do not parse is a broken contract to score, not a bad pair."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str = Field(default="", max_length=256)
    arguments: str = Field(default="", max_length=MAX_TEXT_CHARS)


class ModelOutput(BaseModel):
    """One side of a pair. Per-token data is optional: gateways send what they have."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)

    text: str = Field(max_length=MAX_TEXT_CHARS)
    model: str = ""
    precision: str = ""
    # Per-token entropy in nats, when the server computes it.
    entropy: FiniteFloats | None = Field(default=None, max_length=MAX_TOKENS)
    # Per token: the top-k alternatives as {token: logprob} (OpenAI's shape).
    top_logprobs: list[dict[str, float]] | None = Field(default=None, max_length=MAX_TOKENS)
    # Per token: log-prob of the chosen token under this side's own model.
    token_logprobs: FiniteFloats | None = Field(default=None, max_length=MAX_TOKENS)
    tokens: list[str] | None = Field(default=None, max_length=MAX_TOKENS)
    latency_ms: float | None = Field(default=None, ge=0)
    finish_reason: str | None = None
    engine: EngineInfo | None = None
    # The function calls this side answered with, in order (absent on pairs recorded
    # before they were, and on answers without one): the contract and correctness
    # checks read the first call's arguments (``detectors/answer.py``).
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)

    @field_validator("entropy")
    @classmethod
    def _entropy_ok(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and any(x < 0 for x in v):
            raise ValueError("entropy must be >= 0 nats")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_ok(cls, v: list[dict[str, float]] | None) -> list[dict[str, float]] | None:
        if v is not None:
            for d in v:
                _finite(list(d.values()), "top_logprobs")
        return v


class RequestInfo(BaseModel):
    """What was asked, and how it was decoded: greedy and sampled drift differently."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)

    prompt: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    prompt_hash: str | None = Field(default=None, max_length=128)
    private: bool = False
    precision_preference: PrecisionPreference | None = None
    expects_json: bool = False
    json_schema: dict[str, Any] | None = None
    expected_keys: list[str] | None = Field(default=None, max_length=256)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    task: str | None = Field(default=None, max_length=64)
    # A checkable answer, where the producer knows it (the corpus's prompts do): the
    # outcome test then asks whether each side got it right, not only whether they
    # agree (detectors/correctness.py says how each kind is checked).
    expected_answer: str | None = Field(default=None, max_length=4096)
    answer_kind: Literal["number", "json", "label", "text"] | None = None

    @property
    def decoding(self) -> Literal["greedy", "sampled"]:
        """Greedy only when the request said temperature 0 (``decoding_of``)."""
        return decoding_of(self.temperature)


TagName = Annotated[str, StringConstraints(min_length=1, max_length=32)]
TagValue = Annotated[str, StringConstraints(max_length=64)]


class PairEvent(Message):
    """The message a gateway produces to ``quantdrift.pairs.v1`` (key = pair_id).

    Keys are in ``quantdrift.schemas.record_keys``: pairs spread over workers by id.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    pair_id: PairId
    ts: float = Field(ge=0)
    route: RouteName
    kind: PairKind = "shadow"
    candidate: ModelOutput
    reference: ModelOutput
    request: RequestInfo = RequestInfo()
    # Teacher-forced cross-scoring: the reference model's log-prob of each of the
    # candidate's tokens (one prefill on the reference; vLLM's prompt logprobs).
    reference_logprobs_on_candidate: FiniteFloats | None = Field(
        default=None, max_length=MAX_TOKENS
    )
    # The same pass's view at each of those positions, when the reference reported it
    # (vLLM ``prompt_logprobs: K``, the lab's ``/v1/score`` with ``top_k``): its top-k
    # tokens as {token: logprob} (OpenAI's shape, at most 20 each), and the 1-based rank
    # of the candidate's token among all of the reference's. They say where the
    # candidate first left the reference (``detectors/divergence.py``).
    reference_top_on_candidate: list[dict[str, float]] | None = Field(
        default=None, max_length=MAX_TOKENS
    )
    reference_rank_on_candidate: list[Annotated[int, Field(ge=1)]] | None = Field(
        default=None, max_length=MAX_TOKENS
    )
    sample_rate: float = Field(default=1.0, gt=0, le=1)
    # The pair's slice (script / language, input-length bucket, output kind, decoding, a
    # caller's task tag): computed once where the request is planned, or set by the
    # producer. Bounded: at most 16 dimensions, short names and values.
    tags: dict[TagName, TagValue] = Field(default_factory=dict, max_length=16)
    # Labels for evaluation only (the lab sets them); the judge never reads them.
    label: str | None = Field(default=None, max_length=64)

    @field_validator("reference_top_on_candidate")
    @classmethod
    def _forced_top_ok(cls, v: list[dict[str, float]] | None) -> list[dict[str, float]] | None:
        for d in v or ():
            if len(d) > MAX_FORCED_TOP:
                raise ValueError(f"reference_top_on_candidate: at most {MAX_FORCED_TOP} a position")
            _finite(list(d.values()), "reference_top_on_candidate")
        return v

    @model_validator(mode="after")
    def _private_prompt(self) -> PairEvent:
        if self.request.private and self.request.prompt is not None:
            raise ValueError("request.private is set: send prompt_hash, never the prompt")
        return self
