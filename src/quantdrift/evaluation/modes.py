"""Evaluation modes: what a gateway can send, and which prompts a figure may use.

A gateway in front of a closed API has no log-probs; one in front of vLLM may
have log-probs but no teacher-forced cross-scoring. Each mode's detection power
is measured by stripping the pairs to what that gateway would send, so the same
recorded pairs answer "what does the guard catch without X".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from quantdrift.data.prompts import part_of
from quantdrift.schemas import PairEvent

LogprobMode = Literal["full", "no-teacher-forcing", "none"]
LOGPROB_MODES: tuple[LogprobMode, ...] = ("full", "no-teacher-forcing", "none")
DecodingFilter = Literal["any", "greedy", "sampled"]


def strip(pair: PairEvent, mode: LogprobMode) -> PairEvent:
    """The pair as a gateway in ``mode`` would have sent it.

    >>> from quantdrift.schemas.pair import ModelOutput
    >>> p = PairEvent(pair_id="x", ts=0, route="r", candidate=ModelOutput(text="a",
    ...     entropy=[0.1]), reference=ModelOutput(text="a"), reference_logprobs_on_candidate=[-1.0])
    >>> strip(p, "none").candidate.entropy is None, strip(p, "no-teacher-forcing").candidate.entropy
    (True, [0.1])
    """
    if mode == "full":
        return pair
    update: dict[str, object] = {"reference_logprobs_on_candidate": None}
    if mode == "none":
        bare = {"entropy": None, "top_logprobs": None, "token_logprobs": None}
        update["candidate"] = pair.candidate.model_copy(update=bare)
        update["reference"] = pair.reference.model_copy(update=bare)
    return pair.model_copy(update=update)


def select(
    pairs: Iterable[PairEvent],
    *,
    labels: tuple[str, ...] | None = None,
    decoding: DecodingFilter = "any",
    part: Literal["calibration", "evaluation"] | None = None,
    kinds: tuple[str, ...] = ("shadow", "noise"),
) -> list[PairEvent]:
    """Pairs by label, decoding mode, prompt part and kind.

    A label names the pairs of one candidate: the pair's own ``label`` (the lab sets
    it), or what served the candidate side, which is all a gateway's pairs carry
    (gateways leave ``label`` empty): its precision (``int8``), its served model name
    (``int4-g64-gptq``) or its engine identity (``vllm/0.32.0/int4-g64-gptq``). So an
    operator blesses a baseline from production traffic by naming the build that
    served it. ``part`` follows :func:`quantdrift.data.prompts.part_of`: the lab's own
    split for its prompts, a stable hash split for any other prompt.
    """
    out = []
    for p in pairs:
        if p.kind not in kinds:
            continue
        if labels is not None and not labels_match(p, labels):
            continue
        if decoding != "any" and p.request.decoding != decoding:
            continue
        if part is not None and part_of(p.request.prompt, p.request.prompt_hash) != part:
            continue
        out.append(p)
    return out


def labels_match(pair: PairEvent, labels: tuple[str, ...]) -> bool:
    """Whether one of ``labels`` names the pair's candidate (see :func:`select`).

    >>> from quantdrift.schemas.pair import EngineInfo, ModelOutput, PairEvent
    >>> served = EngineInfo(engine="vllm", version="0.32.0", model="int8")
    >>> pair = PairEvent(pair_id="p", route="r", ts=0.0,
    ...     candidate=ModelOutput(text="a", precision="int4", model="int8", engine=served),
    ...     reference=ModelOutput(text="a", precision="bf16"))
    >>> [labels_match(pair, (x,)) for x in ("int4", "int8", "vllm/0.32.0/int8", "bf16")]
    [True, True, True, False]
    """
    c = pair.candidate
    names = {pair.label, c.precision, c.model, c.engine.identity() if c.engine else None}
    return any(label in names for label in labels if label)
