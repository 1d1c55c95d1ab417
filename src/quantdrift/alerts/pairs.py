"""An alert's worst pairs as on-call reads them: one line each. Pure.

A breaker alert's ``evidence.worst_pairs`` (``breaker/worst.py``) names each pair, its
slice, its prompt as the pair carried it (an excerpt where the route sends prompts in
clear, else the salted hash, which joins with the gateway's and the dead letters'),
why it failed, and, for a teacher-forced pair, the first token where the candidate
left the reference (``detectors/divergence.py``). Slack and ``alerts tail`` show these
lines; Alertmanager gets the evidence itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from quantdrift.schemas.score import DivergentToken


def pair_line(w: Mapping[str, Any]) -> str:
    """One worst pair.

    >>> pair_line({"pair_id": "r1:shadow", "similarity": 0.4, "reasons": ["tf_kl 0.9 > 0.1"],
    ...            "tags": {"language": "zh"}, "prompt_hash": "ab12cd34ef56",
    ...            "first_divergent_token": {"position": 2, "of": 5, "token": "x", "rank": 9,
    ...                                      "reference_logprob": -7.0, "preferred": {"y": -0.1}}})
    "r1:shadow [language=zh] prompt #ab12cd34ef56: tf_kl 0.9 > 0.1; token 2/5 'x': reference rank 9, log-prob -7.00; it preferred 'y'"
    """  # noqa: E501
    line = str(w.get("pair_id"))
    tags = w.get("tags") or {}
    if tags:
        line += " [" + " ".join(f"{k}={v}" for k, v in sorted(tags.items())) + "]"
    if w.get("prompt") is not None:
        line += f" prompt {str(w['prompt'])[:80]!r}"
    elif w.get("prompt_hash") is not None:
        line += f" prompt #{str(w['prompt_hash'])[:12]}"
    reasons = list(w.get("reasons") or [])
    if not reasons and w.get("similarity") is not None:
        reasons = [f"similarity {float(w['similarity']):.3f}"]
    line += ": " + ("; ".join(str(r) for r in reasons) or "kept as one of the least similar")
    found = w.get("first_divergent_token")
    if isinstance(found, Mapping):
        # An entry from another version is left out: the pair's other facts still show.
        with contextlib.suppress(ValidationError):
            line += "; " + DivergentToken.model_validate(found).line()
    return line


def worst_lines(evidence: Mapping[str, Any], n: int = 3) -> list[str]:
    """The first ``n`` worst pairs of an alert's evidence, one line each."""
    worst = evidence.get("worst_pairs") or []
    return [pair_line(w) for w in worst[:n] if isinstance(w, Mapping)]
