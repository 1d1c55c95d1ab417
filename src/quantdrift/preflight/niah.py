# ruff: noqa: E501  (the built-in data tables read best one record a line)
"""``niah``: needle in a haystack, candidate against reference.

The product side's veto: a 4-bit model can keep its short-prompt quality and
still lose facts in a long context (recall 99.8 % -> 82 %). Each case hides one
fact at a depth of a filler text of a nominal length, asks for it, and counts a
hit when the answer string is in the reply (``detectors.lexical.needle_hit``, the lab's rule too).
Haystacks are built from shuffled filler sentences with a fixed seed, so
reference and candidate see byte-identical prompts and reruns are comparable.

Lengths are nominal tokens (about 0.75 words per token for English prose);
each case records the prompt tokens the server reported.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quantdrift.detectors.lexical import needle_hit

FILLER = (
    "The quarterly operations review covered many routine topics.",
    "The facilities team reported that new badge readers were installed on every floor.",
    "The cafeteria will extend its opening hours during the winter months.",
    "Expense reports must be filed within thirty days of the purchase.",
    "Receipts older than ninety days cannot be reimbursed.",
    "The internal wiki moves to a new platform over several weekends.",
    "Teams were asked to archive pages they no longer use.",
    "Most staff said they were satisfied with flexible working.",
    "Many asked for clearer career paths and a larger training budget.",
    "The sustainability committee proposed replacing paper cups with reusable mugs.",
    "More bicycle racks will be installed near the main entrance.",
    "Security reminded staff to lock their screens when they leave their desks.",
    "Suspicious emails should be reported to the help desk at once.",
    "Visitors must park in the marked spaces behind the building.",
    "The next review will take place in the large conference room.",
    "The printer on the second floor has been replaced with a faster model.",
    "New starters receive their laptops on the first morning.",
    "The library of shared templates was cleaned up and reorganised.",
    "Meeting rooms can now be booked from the calendar app.",
    "The summer party will have live music and a barbecue.",
)


@dataclass(frozen=True, slots=True)
class Needle:
    fact: str
    question: str
    answer: str


DEFAULT_NEEDLES = (
    Needle("The secret code for the storage room is 7319.", "What is the secret code for the storage room?", "7319"),
    Needle("The company picnic will be held in Lisbon this year.", "In which city will the company picnic be held?", "Lisbon"),
    Needle("The backup server is painted bright orange.", "What color is the backup server?", "orange"),
    Needle("The new project manager for the Atlas project is named Priya.", "Who is the new project manager for the Atlas project?", "Priya"),
    Needle("The guest speaker next month is a marine biologist named Tomas.", "What is the name of the guest speaker next month?", "Tomas"),
    Needle("The office plants are watered every Thursday.", "On which day are the office plants watered?", "Thursday"),
)  # fmt: skip
DEFAULT_DEPTHS = (0.1, 0.5, 0.9)
UNKNOWN_CONTEXT_LENGTHS = (256, 1024)
WORDS_PER_TOKEN = 0.75


def default_lengths(context_length: int | None) -> tuple[int, ...]:
    """Nominal haystack lengths that suit an endpoint's context.

    Unknown context: short lengths any model allows. Known: a quarter, a half,
    and the full window less room for the question and the answer.

    >>> default_lengths(None), default_lengths(8192), default_lengths(32768)
    ((256, 1024), (2048, 4096, 7680), (8192, 16384, 32256))
    """
    if not context_length:
        return UNKNOWN_CONTEXT_LENGTHS
    top = max(256, context_length - 512)
    return tuple(sorted({context_length // 4, context_length // 2, top}))


def haystack(length_tokens: int, needle: Needle, depth: float, seed: int = 0) -> str:
    """The prompt: filler of about ``length_tokens`` with the fact at ``depth`` (0..1)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    rng = random.Random(seed)
    words_target = int(length_tokens * WORDS_PER_TOKEN)
    sentences: list[str] = []
    words = 0
    while words < words_target:
        s = FILLER[rng.randrange(len(FILLER))]
        sentences.append(s)
        words += len(s.split())
    sentences.insert(round(depth * len(sentences)), needle.fact)
    return (
        "Read the following notes carefully.\n\n"
        + " ".join(sentences)
        + f"\n\nQuestion: {needle.question} Answer in one short sentence."
    )


@dataclass(frozen=True, slots=True)
class Case:
    length: int
    depth: float
    needle: Needle

    @property
    def seed(self) -> int:
        return self.length * 1000 + round(self.depth * 100)


def cases(
    lengths: Sequence[int], depths: Sequence[float], needles: Sequence[Needle], per_cell: int = 2
) -> list[Case]:
    """``per_cell`` needles at each (length, depth), rotating through ``needles`` so every
    needle meets every length; the same list for both sides.

    >>> [(c.length, c.depth, c.needle.answer) for c in cases([256], [0.5], DEFAULT_NEEDLES, 2)]
    [(256, 0.5, '7319'), (256, 0.5, 'Lisbon')]
    """
    if not needles or per_cell < 1:
        raise ValueError("at least one needle and per_cell >= 1")
    out, k = [], 0
    for n in lengths:
        for d in depths:
            for _ in range(per_cell):
                out.append(Case(n, d, needles[k % len(needles)]))
                k += 1
    return out


def recall(rows: Sequence[dict[str, Any]], side: str) -> float:
    hits = [bool(r[side]) for r in rows]
    return sum(hits) / len(hits) if hits else 0.0


def by_length(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recall per nominal length, for the plot."""
    out = []
    for n in sorted({r["length"] for r in rows}):
        sub = [r for r in rows if r["length"] == n]
        out.append({"length": n, "candidate": recall(sub, "candidate_hit"),
                    "reference": recall(sub, "reference_hit"), "cases": len(sub)})  # fmt: skip
    return out


def judge(cand: float, ref: float, floor: float, tolerance: float) -> tuple[bool, str]:
    """Veto when the candidate is under the floor, or under the reference minus tolerance.

    >>> judge(0.82, 0.998, 0.9, 0.05)
    (False, 'candidate recall 82.0% < floor 90.0%; candidate recall 82.0% < reference 99.8% - 5.0%')
    >>> judge(1.0, 1.0, 0.9, 0.05)[0]
    True
    """
    problems = []
    if cand < floor:
        problems.append(f"candidate recall {cand:.1%} < floor {floor:.1%}")
    if cand < ref - tolerance - 1e-12:
        problems.append(f"candidate recall {cand:.1%} < reference {ref:.1%} - {tolerance:.1%}")
    if problems:
        return False, "; ".join(problems)
    return True, f"candidate recall {cand:.1%} vs reference {ref:.1%}"


def hit(text: str, answer: str) -> bool:
    return needle_hit(text, answer)
