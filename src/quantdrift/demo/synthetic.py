"""Generated pairs for the demo when asked for (`--synthetic`) or nothing recorded is shipped.

Healthy pairs differ from the reference at paraphrase level; drifted pairs
show the failure modes the seeds describe: hallucinated facts, loops, broken
JSON, collapsed entropy. Seeded: the same seed gives the same stream.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

from quantdrift.schemas import ModelOutput, PairEvent, RequestInfo

ANSWERS = [
    (
        "What is the capital of France?",
        "The capital of France is Paris, which is also its largest city.",
        "Paris is the capital of France and also its largest city.",
    ),
    (
        "How do I reset my password?",
        "Open Settings, choose Security, then click Reset password and follow the emailed link.",
        "Go to Settings, pick Security, click Reset password, then follow the link in the email.",
    ),
    (
        "Summarize the refund policy.",
        "Refunds are issued within 30 days of purchase when the item is returned unused.",
        "You get a refund within 30 days of purchase when the item is returned unused.",
    ),
    (
        "Why is the sky blue?",
        "Sunlight scatters off air molecules, blue light the most, so the sky looks blue.",
        "Air molecules scatter sunlight, blue most strongly, which makes the sky appear blue.",
    ),
    (
        "Explain what a mutex is.",
        "A mutex is a lock that lets only one thread at a time enter a critical section.",
        "A mutex is a lock allowing just one thread at a time into a critical section.",
    ),
    (
        "请用一句话介绍长城。",
        "长城是中国古代修建的军事防御工程，全长两万多公里。",
        "长城是中国古代的军事防御工程，总长度超过两万公里。",
    ),
]

HALLUCINATIONS = [
    "The capital of France is Lyon, founded in 1999 by the Roman senate on the moon.",
    "Password resets are handled by calling the fire department and faxing your birth certificate.",
    "Refunds are only issued on leap years to customers whose names start with Q.",
    "The sky is blue because the ocean paints it every morning with cobalt dye.",
]


def _entropy(rng: random.Random, n: int, level: float) -> list[float]:
    return [round(max(0.0, rng.gauss(level, level / 3)), 4) for _ in range(n)]


def _pair(
    rng: random.Random,
    i: int,
    route: str,
    kind: str,
    prompt: str,
    cand: str,
    ref: str,
    cand_entropy: float,
    label: str,
    expects_json: bool = False,
) -> PairEvent:
    ntok = lambda t: max(1, len(t.split()))  # noqa: E731
    return PairEvent(
        pair_id=f"demo-{label}-{i:05d}",
        ts=time.time(),
        route=route,
        kind=kind,  # type: ignore[arg-type]
        candidate=ModelOutput(
            text=cand,
            model="demo-int4",
            precision="int4",
            entropy=_entropy(rng, ntok(cand), cand_entropy),
        ),
        reference=ModelOutput(
            text=ref, model="demo-bf16", precision="bf16", entropy=_entropy(rng, ntok(ref), 0.9)
        ),
        request=RequestInfo(
            prompt=prompt,
            expects_json=expects_json,
            expected_keys=["name", "email"] if expects_json else None,
            temperature=0.0,
            max_tokens=256,
        ),
        label=label,
    )


def healthy(route: str, seed: int = 7) -> Iterator[PairEvent]:
    """Paraphrase-level differences, plus a noise pair every third pair for the floor."""
    rng = random.Random(seed)
    i = 0
    while True:
        prompt, a, b = ANSWERS[rng.randrange(len(ANSWERS))]
        cand, ref = (a, b) if rng.random() < 0.5 else (b, a)
        yield _pair(rng, i, route, "shadow", prompt, cand, ref, 0.9, "healthy")
        if i % 3 == 0:
            yield _pair(rng, i, route, "noise", prompt, ref, a if ref == b else b, 0.9, "noise")
        i += 1


def drifted(route: str, seed: int = 11) -> Iterator[PairEvent]:
    """The failure modes in turn: hallucination, loop, broken JSON, collapsed entropy."""
    rng = random.Random(seed)
    i = 0
    while True:
        prompt, _, ref = ANSWERS[i % 4]
        mode = i % 4
        if mode == 0:
            yield _pair(rng, i, route, "shadow", prompt, HALLUCINATIONS[i % 4], ref, 1.4, "drifted")
        elif mode == 1:
            loop = "I can help with that. " + "the the the " * 40
            yield _pair(rng, i, route, "shadow", prompt, loop, ref, 0.3, "drifted")
        elif mode == 2:
            ref_json = json.dumps({"name": "Ada Lovelace", "email": "ada@example.com"})
            broken = '{"name": "Ada Lovelace", "name": "Ada Lovelace", "name": "Ada'
            yield _pair(
                rng,
                i,
                route,
                "shadow",
                "Extract name and email as JSON.",
                broken,
                ref_json,
                0.8,
                "drifted",
                expects_json=True,
            )
        else:
            collapsed = ref.split()[0] + " " + " ".join(["okay"] * 30)
            yield _pair(rng, i, route, "shadow", prompt, collapsed, ref, 0.01, "drifted")
        i += 1
