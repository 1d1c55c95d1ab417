"""Streaming degeneration guard: stop a looping or collapsed generation early.

Two probes, fed as the stream arrives, both reusing the detectors:

* repetition: ``detectors.repetition.looping`` on the tokens of the text's tail
  (the last ``tail_chars`` characters, re-tokenized every ``check_every`` chunks,
  so a 4,000-token answer costs a few dozen small numpy passes, not a quadratic
  scan);
* entropy collapse: the mean per-token entropy (``detectors.entropy``, from the
  streamed top-k log-probs) over the last ``entropy_window`` tokens below
  ``entropy_floor`` nats (0.05 by default, the seeds' threshold). The log-probs
  are folded in at the token that first fills the window, then every
  ``check_every`` chunks and at the end, one numpy pass for the lot (per chunk,
  numpy's fixed cost was most of the gateway's CPU per request); each folded
  token's window is checked. Upstreams that send no log-probs are not probed.

``DegenerationProbe.update`` returns the reason ("loop", "entropy_collapse") the
first time a probe fires and keeps returning it after.

Structured output repeats by nature: ``{"values": [0, 0, 0, ...]}``, an identity
matrix, a markdown table, a block of similar code lines. A probe tuned on prose
would call those loops and send good answers down the fallback chain, so:

* a repeating unit made only of numbers and literals (``null``, ``true``,
  ``false``) is never a loop (data, not degeneration;
  a model stuck on zeros runs into ``max_tokens`` and is reported as truncated);
* inside structure (the request asked for JSON, the text is inside a code fence,
  the tail is table rows, or brackets, quotes, pipes and tags make up more than
  ``structural_share`` of it: JSON or HTML in a free-text answer) a loop needs
  ``structured_min_copies`` copies over at least ``structured_min_tokens``
  tokens: a runaway loop still trips, since it
  runs until ``max_tokens``, while a table with a few equal rows does not;
* entropy collapse is not probed inside structure: JSON keys, braces and code
  boilerplate are near-certain tokens in a healthy model too.

``tests/unit/test_degeneration.py`` keeps a corpus of real-looking JSON, tables
and code and checks 0 trips on it.

Examples
--------
>>> probe = DegenerationProbe(DegenerationConfig(check_every=1))
>>> [probe.update("Sure. ") for _ in range(2)][-1] is None
True
>>> any(probe.update("I am sorry. ") for _ in range(8))
True
>>> probe.reason
'loop'
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from quantdrift.detectors.entropy import entropy_from_top_logprobs
from quantdrift.detectors.repetition import (
    LOOP_MAX_PERIOD,
    LOOP_MIN_COPIES,
    LOOP_MIN_TOKENS,
    LOOP_TAIL_SHARE,
    LOOP_TAIL_WINDOW,
    token_ids,
)
from quantdrift.detectors.tokenize import tokenize
from quantdrift.gateway.gateway_config import DegenerationConfig

_STRUCTURAL = '{}[]"|<>='
_LITERALS = frozenset({"null", "true", "false", "none", "nan"})
LOOP = "loop"
ENTROPY_COLLAPSE = "entropy_collapse"


class DegenerationProbe:
    """Feed streamed deltas (and their per-token top log-probs when there are any)."""

    def __init__(self, config: DegenerationConfig | None = None, structured: bool = False) -> None:
        self.config = config or DegenerationConfig()
        self.structured = structured  # the request asked for JSON
        self._fences = 0
        self._carry = ""
        self._tail = ""
        self._chars = 0
        self._chunks = 0
        self._window: deque[float] = deque(maxlen=self.config.entropy_window)
        self._sum = 0.0
        self._pending: list[Mapping[str, float]] = []  # top log-probs not yet in the window
        self.reason: str | None = None
        self.detail: str = ""

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def update(
        self, delta: str, top_logprobs: Sequence[Mapping[str, float]] | None = None
    ) -> str | None:
        """Take one streamed delta; the reason once a probe fired, else None."""
        cfg = self.config
        if self.reason is not None or not cfg.enabled:
            return self.reason
        if delta:
            self._tail = (self._tail + delta)[-cfg.tail_chars :]
            self._chars += len(delta)
            self._count_fences(delta)
        self._chunks += 1
        if cfg.entropy and top_logprobs:
            self._pending.extend(top_logprobs)
        check = self._chunks % cfg.check_every == 0
        # Folded every check_every chunks, and at the token that first fills the window
        # (a stream's hold-back is sized on that token: a collapse from the start must
        # trip before the first byte goes out).
        window = len(self._window)
        fills = window < cfg.entropy_window <= window + len(self._pending)
        if self._pending and (check or fills) and self._collapsed():
            return self.reason
        if cfg.repetition and self._chars >= cfg.min_chars and check and self._looping():
            self.reason = LOOP
            self.detail = "the text ends in a repeating loop"
        return self.reason

    def finish(self) -> str | None:
        """Last check at the end of the stream (the chunk count may not have hit a check)."""
        cfg = self.config
        if self.reason is None and cfg.enabled and self._pending and self._collapsed():
            return self.reason
        if (
            self.reason is None
            and cfg.enabled
            and cfg.repetition
            and self._chars >= cfg.min_chars
            and self._looping()
        ):
            self.reason = LOOP
            self.detail = "the text ends in a repeating loop"
        return self.reason

    def _collapsed(self) -> bool:
        """Fold the pending log-probs into the entropy window; True (and the reason set)
        when the window is full and its mean is below the floor. Outside structure only."""
        pending, self._pending = self._pending, []
        cfg = self.config
        if self._in_structure():
            return False
        for h in entropy_from_top_logprobs(pending).tolist():
            self._push(h)
            if len(self._window) == cfg.entropy_window:
                mean = self._sum / len(self._window)
                if mean < cfg.entropy_floor:
                    self.reason = ENTROPY_COLLAPSE
                    self.detail = (
                        f"mean entropy {mean:.4f} nats over the last {len(self._window)} tokens"
                    )
                    return True
        return False

    def _push(self, h: float) -> None:
        window = self._window
        if len(window) == window.maxlen:
            self._sum -= window[0]
        window.append(h)
        self._sum += h

    def _count_fences(self, delta: str) -> None:
        # A fence may arrive split over two deltas: keep the last two characters.
        text = self._carry + delta
        self._fences += text.count("```") - self._carry.count("```")
        self._carry = text[-2:]

    def _in_structure(self) -> bool:
        """JSON was asked for, a code fence is open or in the tail, or the tail is table rows."""
        if self.structured or self._fences % 2 == 1 or "```" in self._tail:
            return True
        lines = [ln.strip() for ln in self._tail.splitlines()[-6:] if ln.strip()]
        if len(lines) >= 3 and all(ln.startswith("|") for ln in lines):
            return True
        tail = self._tail[-400:]
        marks = sum(tail.count(c) for c in _STRUCTURAL)
        return bool(tail) and marks / len(tail) >= self.config.structural_share

    def _looping(self) -> bool:
        tokens = tokenize(self._tail)
        if not tokens:
            return False
        cfg = self.config
        structure = self._in_structure()
        for period, run in loop_runs(tokens):
            unit = tokens[len(tokens) - period :]
            if all(t.isdigit() or t in _LITERALS for t in unit):
                continue  # numbers and literals repeating are data
            if structure and (
                run < cfg.structured_min_copies * period or run < cfg.structured_min_tokens
            ):
                continue
            return True
        return False


def loop_runs(tokens: list[str]) -> list[tuple[int, int]]:
    """(period, run length) of every periodic tail that ``repetition.looping`` calls a loop.

    The same rule as ``detectors.repetition.looping`` (three copies, eight tokens,
    half of the last 64), returning each qualifying period so the caller can judge
    the repeating unit itself.

    >>> loop_runs(tokenize("Answer: 42. " + "I am sorry. " * 6))
    [(3, 18), (6, 18)]
    """
    ids = token_ids(tokens)
    n = len(ids)
    if n < LOOP_MIN_TOKENS:
        return []
    need = max(LOOP_MIN_TOKENS, LOOP_TAIL_SHARE * min(n, LOOP_TAIL_WINDOW))
    max_period = min(LOOP_MAX_PERIOD, n // LOOP_MIN_COPIES)
    if max_period < 1:
        return []
    out = []
    lookback = ids[n - 1 - max_period : n - 1][::-1]
    for p in np.flatnonzero(lookback == ids[-1]) + 1:
        tail = (ids[p:] == ids[:-p])[::-1]
        matched = int(np.argmin(tail)) if not tail.all() else len(tail)
        r = matched + int(p)
        if r >= LOOP_MIN_COPIES * p and r >= need:
            out.append((int(p), r))
    return out


def check_text(
    text: str,
    top_logprobs: Sequence[Mapping[str, float]] | None = None,
    config: DegenerationConfig | None = None,
    structured: bool = False,
) -> tuple[str | None, str]:
    """(reason, detail) for a whole answer (non-streamed upstream replies)."""
    probe = DegenerationProbe(config, structured)
    probe.update(text, top_logprobs)
    return probe.finish(), probe.detail
