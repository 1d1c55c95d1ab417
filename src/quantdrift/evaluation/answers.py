"""Checkable answers joined to recorded pairs, and how often each side got them right.

A corpus recorded before pairs carried ``RequestInfo.expected_answer`` still has each
prompt's checkable answer in its prompts file (``quantdrift lab corpus build``). The
evaluation joins the two by prompt id, so the outcome test judges correctness on the
checkable prompts of old blocks as it does on new ones, without re-recording them.

The join is strict where it can be: a pair that carries its prompt in clear must carry
the very prompt of that id, or the prompts file is not this corpus's and the join is
refused (a wrong answer key would read as a drifted model). A pair that already
carries an answer keeps it. Pure: the prompts file is read by the caller
(``lab.corpus.build.answers``), and the tally reads metrics already scored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from quantdrift.schemas import Metrics, PairEvent

# By prompt id: (expected answer, its kind, the prompt as a pair renders it in clear);
# answer and kind are None for a prompt with nothing to check. Plain tuples: the lab,
# which reads prompts files, does not import this package.
PromptAnswer = tuple[str | None, str | None, str | None]


@dataclass(frozen=True, slots=True)
class JoinCount:
    """What a join found per pair: its own answer (``carried``), one from the prompts
    file (``joined``), none to check (``unchecked``), a prompt id the file lacks
    (``unknown``)."""

    carried: int = 0
    joined: int = 0
    unchecked: int = 0
    unknown: int = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


def join_answers(
    pairs: Sequence[PairEvent],
    answers: Mapping[str, PromptAnswer],
    prompt_of: Callable[[PairEvent], str],
) -> tuple[list[PairEvent], JoinCount]:
    """``pairs`` with each one's expected answer filled from its prompt's (``prompt_of``
    maps a pair to its prompt id), in order, and what the join found.

    Raises ValueError when a pair's clear prompt is not the prompt file's of that id.
    """
    out: list[PairEvent] = []
    n: Counter[str] = Counter()
    for p in pairs:
        pid = prompt_of(p)
        entry = answers.get(pid)
        if entry is None:
            n["unknown"] += 1
            out.append(p)
            continue
        expected, kind, prompt = entry
        if p.request.prompt is not None and prompt is not None and p.request.prompt != prompt:
            raise ValueError(
                f"pair {p.pair_id}: its prompt is not prompt {pid} of the prompts file "
                "(a prompts file of another corpus?)"
            )
        if p.request.expected_answer is not None:
            n["carried"] += 1
            out.append(p)
        elif expected is None or kind is None:
            n["unchecked"] += 1
            out.append(p)
        else:
            n["joined"] += 1
            request = p.request.model_copy(
                update={"expected_answer": expected, "answer_kind": kind}
            )
            out.append(p.model_copy(update={"request": request}))
    return out, JoinCount(**n)


@dataclass
class Correctness:
    """One answer kind's tally: checkable prompts, and per side the ones it got right."""

    checkable: int = 0
    right: Counter[str] = field(default_factory=Counter)

    def rates(self) -> dict[str, float]:
        return {side: round(k / self.checkable, 4) for side, k in self.right.items()}


def tally(
    prompts: Iterable[tuple[str | None, Metrics, Mapping[str, Metrics]]],
    reference: str = "reference",
) -> dict[str, Correctness]:
    """Per answer kind (and ``all``): how many prompts were checkable and how many each
    side answered right. Each item is one prompt: its answer kind, one shadow pair's
    metrics (its reference side is the reference's answer, the one every candidate of
    the prompt is compared with) and each candidate's metrics by label."""
    out: dict[str, Correctness] = {}
    for kind, ref, candidates in prompts:
        if kind is None or ref.reference_answer_ok is None:
            continue
        for key in (kind, "all"):
            c = out.setdefault(key, Correctness())
            c.checkable += 1
            c.right[reference] += ref.reference_answer_ok
            for label, m in candidates.items():
                c.right[label] += bool(m.answer_ok)
    return out
