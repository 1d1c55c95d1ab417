"""Capacity guards with readable state: the retry budget and outlier ejection.

Both take ``now`` as a parameter (no clock inside), so tests move time instead
of sleeping.

* ``RetryBudget`` (Envoy's retry budget): fallbacks are allowed while those of
  the last ``window_s`` stay below ``min_per_window + ratio * requests``. When an
  overloaded INT4 pool fails everything, only a share of its traffic lands on
  BF16; the rest gets an error at once instead of taking the reference down too.
* ``OutlierDetector``: a server that failed ``consecutive_failures`` times in a
  row is skipped for ``base_ejection_s`` times the number of its ejections
  (capped), then tried again. A pool never ejects all its servers: with every
  server out, they are all tried (what Envoy's ``max_ejection_percent`` keeps).

Examples
--------
>>> budget = RetryBudget(ratio=0.5, min_per_window=0, window_s=10)
>>> for t in range(4):
...     budget.record_request(float(t))
>>> [budget.try_fallback(4.0) for _ in range(3)]
[True, True, False]
>>> budget.try_fallback(20.0)  # the window moved on: no requests, no budget
False
>>> od = OutlierDetector(consecutive_failures=2, base_ejection_s=30, max_ejection_s=300)
>>> od.failure("a", 0.0), od.failure("a", 1.0)
(False, True)
>>> od.available(["a", "b"], 2.0), od.available(["a", "b"], 40.0)
(['b'], ['a', 'b'])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class RetryBudget:
    """Fallbacks at most ``min_per_window + ratio * requests`` per sliding window."""

    ratio: float = 0.2
    min_per_window: int = 5
    window_s: float = 10.0
    _requests: deque[float] = field(default_factory=deque)
    _fallbacks: deque[float] = field(default_factory=deque)
    refused: int = 0

    def _trim(self, now: float) -> None:
        edge = now - self.window_s
        for q in (self._requests, self._fallbacks):
            while q and q[0] < edge:
                q.popleft()

    def record_request(self, now: float) -> None:
        self._trim(now)
        self._requests.append(now)

    def available(self, now: float) -> bool:
        """Whether one more fallback would fit now (a peek: nothing is taken)."""
        self._trim(now)
        return len(self._fallbacks) + 1 <= self.min_per_window + self.ratio * len(self._requests)

    def try_fallback(self, now: float) -> bool:
        """Take one fallback from the budget; False (and counted) when it is spent."""
        self._trim(now)
        allowed = self.min_per_window + self.ratio * len(self._requests)
        if len(self._fallbacks) + 1 > allowed:
            self.refused += 1
            return False
        self._fallbacks.append(now)
        return True


@dataclass(slots=True)
class _Server:
    failures: int = 0
    ejections: int = 0
    until: float = 0.0


@dataclass(slots=True)
class OutlierDetector:
    """Consecutive-failure ejection per server URL."""

    consecutive_failures: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    _servers: dict[str, _Server] = field(default_factory=dict)
    ejected_total: int = 0

    def success(self, url: str) -> None:
        s = self._servers.get(url)
        if s is not None:
            s.failures = 0

    def failure(self, url: str, now: float) -> bool:
        """Count one failure; True when it ejects the server."""
        s = self._servers.setdefault(url, _Server())
        s.failures += 1
        if s.failures < self.consecutive_failures or s.until > now:
            return False
        s.ejections += 1
        s.failures = 0
        s.until = now + min(self.max_ejection_s, self.base_ejection_s * s.ejections)
        self.ejected_total += 1
        return True

    def ejected(self, url: str, now: float) -> bool:
        s = self._servers.get(url)
        return s is not None and s.until > now

    def available(self, urls: Sequence[str], now: float) -> list[str]:
        """``urls`` without the ejected ones; all of them when every one is ejected."""
        live = [u for u in urls if not self.ejected(u, now)]
        return live or list(urls)
