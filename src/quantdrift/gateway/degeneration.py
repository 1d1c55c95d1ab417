"""Streaming degeneration guard: stop a looping or collapsed generation early.

Two probes, fed as the stream arrives, both reusing the detectors:

* repetition: ``detectors.repetition.looping`` on the tokens of the text's tail
  (the last ``tail_chars`` characters, re-tokenized every ``check_every`` chunks,
  so a 4,000-token answer costs a few dozen small numpy passes, not a quadratic
  scan);
* entropy collapse: the mean per-token entropy (``detectors.entropy``, from the
  streamed top-k log-probs) over the last ``entropy_window`` tokens below
  ``entropy_floor`` nats (0.05 by default, the seeds' threshold). Upstreams that
  send no log-probs are simply not probed.

``DegenerationProbe.update`` returns the reason ("loop", "entropy_collapse") the
first time a probe fires and keeps returning it after.

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

from pydantic import BaseModel, ConfigDict, Field

from quantdrift.detectors.entropy import entropy_from_top_logprobs
from quantdrift.detectors.repetition import looping, token_ids
from quantdrift.detectors.tokenize import tokenize

LOOP = "loop"
ENTROPY_COLLAPSE = "entropy_collapse"


class DegenerationConfig(BaseModel):
    """Knobs of the probes; ``enabled`` False turns the guard off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    repetition: bool = True
    tail_chars: int = Field(default=1500, ge=64)
    check_every: int = Field(default=8, ge=1)
    min_chars: int = Field(default=24, ge=0)
    entropy: bool = True
    entropy_floor: float = Field(default=0.05, ge=0)
    entropy_window: int = Field(default=48, ge=4)


class DegenerationProbe:
    """Feed streamed deltas (and their per-token top log-probs when there are any)."""

    def __init__(self, config: DegenerationConfig | None = None) -> None:
        self.config = config or DegenerationConfig()
        self._tail = ""
        self._chars = 0
        self._chunks = 0
        self._window: deque[float] = deque(maxlen=self.config.entropy_window)
        self._sum = 0.0
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
        self._chunks += 1
        if cfg.entropy and top_logprobs:
            for h in entropy_from_top_logprobs(top_logprobs):
                self._push(float(h))
            if len(self._window) == cfg.entropy_window:
                mean = self._sum / len(self._window)
                if mean < cfg.entropy_floor:
                    self.reason = ENTROPY_COLLAPSE
                    self.detail = (
                        f"mean entropy {mean:.4f} nats over the last {len(self._window)} tokens"
                    )
                    return self.reason
        if (
            cfg.repetition
            and self._chars >= cfg.min_chars
            and self._chunks % cfg.check_every == 0
            and self._looping()
        ):
            self.reason = LOOP
            self.detail = "the text ends in a repeating loop"
        return self.reason

    def finish(self) -> str | None:
        """Last check at the end of the stream (the chunk count may not have hit a check)."""
        cfg = self.config
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

    def _push(self, h: float) -> None:
        window = self._window
        if len(window) == window.maxlen:
            self._sum -= window[0]
        window.append(h)
        self._sum += h

    def _looping(self) -> bool:
        tokens = tokenize(self._tail)
        return bool(tokens) and looping(token_ids(tokens))


def check_text(
    text: str,
    top_logprobs: Sequence[Mapping[str, float]] | None = None,
    config: DegenerationConfig | None = None,
) -> tuple[str | None, str]:
    """(reason, detail) for a whole answer (non-streamed upstream replies)."""
    probe = DegenerationProbe(config)
    probe.update(text, top_logprobs)
    return probe.finish(), probe.detail
