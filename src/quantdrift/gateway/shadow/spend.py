"""What shadowing spends, per route, kept apart from what users are served.

Every upstream call the shadow runner makes is metered here, never in the served
answer's counters (``completion_tokens`` counts users' answers only): calls, prompt
and completion tokens, and seconds, by route, by the side that paid (``reference``
or ``candidate``: the candidate is called in shadow while a route is half-open, and
by a collector, which serves no user) and by purpose:

* ``shadow``: the other side's answer for a shadow pair;
* ``noise``: the reference's runs for a noise pair;
* ``teacher_forcing``: the forced pass that scores the candidate's tokens on the
  reference (prompt + answer in, one token out).

Tokens come from what the upstream reports (``usage`` on the stream, the forced
pass's token count). A call that reports none (a server without
``stream_options.include_usage``, a call that failed) is still counted, with its
seconds, and counted ``unmetered``, so the token figures say how much they cover.
Seconds are the calls' wall-clock time: with batching on the server, the time a
replica was busy for them is less.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from quantdrift.gateway.openai_wire import Completion
from quantdrift.gateway.telemetry import counter
from quantdrift.gateway.upstream.teacher_forcing import Outcome, Scored

PURPOSES = ("shadow", "noise", "teacher_forcing")
SIDES = ("reference", "candidate")
# One side's figures in ``SpendMeter.totals`` (and a gateway's spend report).
TOTALS = ("calls", "tokens", "seconds", "teacher_forcing_calls", "unmetered")


@dataclass(slots=True)
class Spent:
    """One (route, side, purpose)'s running totals."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    unmetered: int = 0  # calls whose tokens the upstream did not report


class SpendMeter:
    """Running totals of the shadow runner's upstream calls (module docstring).

    >>> meter = SpendMeter()
    >>> meter.add("r", "reference", "shadow", 0.5, prompt_tokens=7, completion_tokens=3)
    >>> meter.add("r", "reference", "teacher_forcing", 0.25, prompt_tokens=None)
    >>> meter.view("r")["reference"]["shadow"]
    {'calls': 1, 'prompt_tokens': 7, 'completion_tokens': 3, 'seconds': 0.5, 'unmetered': 0}
    >>> meter.view("r")["reference"]["teacher_forcing"]["unmetered"]
    1
    """

    def __init__(self) -> None:
        self._spent: dict[tuple[str, str, str], Spent] = {}

    def add(
        self,
        route: str,
        side: str,
        purpose: str,
        seconds: float,
        *,
        prompt_tokens: int | None,
        completion_tokens: int | None = None,
    ) -> None:
        """One call: its seconds, and its tokens when the upstream reported them."""
        spent = self._spent.setdefault((route, side, purpose), Spent())
        spent.calls += 1
        spent.seconds += max(0.0, seconds)
        if prompt_tokens is None:
            spent.unmetered += 1
            return
        spent.prompt_tokens += prompt_tokens
        spent.completion_tokens += completion_tokens or 0

    def answer(
        self, route: str, side: str, purpose: str, seconds: float, done: Completion | None
    ) -> None:
        """One streamed call: its tokens from the answer's ``usage`` (None: it failed)."""
        usage = done.usage if done is not None else None
        prompt = usage.get("prompt_tokens") if usage else None
        self.add(
            route,
            side,
            purpose,
            seconds,
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            completion_tokens=done.completion_tokens if done is not None else None,
        )

    def forced(self, route: str, side: str, seconds: float, outcome: Outcome | None) -> None:
        """One teacher-forcing pass: the tokens it read in, one generated."""
        tokens = outcome.tokens if isinstance(outcome, Scored) else None
        self.add(
            route,
            side,
            "teacher_forcing",
            seconds,
            prompt_tokens=tokens,
            completion_tokens=None if tokens is None else 1,
        )

    def reference(self, routes: tuple[str, ...]) -> tuple[int, int]:
        """What ``routes`` spent on the reference (tokens, every purpose) and their shadow
        jobs (one ``shadow`` call each, on whichever side answered it): the adaptive
        share's cap reads them (``control/share.py``).

        >>> meter = SpendMeter()
        >>> meter.add("r", "reference", "shadow", 0.1, prompt_tokens=7, completion_tokens=3)
        >>> meter.add("r@x", "reference", "teacher_forcing", 0.1, prompt_tokens=10)
        >>> meter.reference(("r", "r@x"))
        (20, 1)
        """
        tokens = jobs = 0
        for (r, side, purpose), spent in self._spent.items():
            if r not in routes:
                continue
            if side == "reference":
                tokens += spent.prompt_tokens + spent.completion_tokens
            if purpose == "shadow" and r == routes[0]:
                jobs += spent.calls
        return tokens, jobs

    def totals(self, route: str) -> dict[str, dict[str, float]]:
        """Per side, the route's totals over every purpose, with its teacher-forcing calls
        counted apart: the figures a gateway reports to the status page
        (``control/spend_report.py``).

        >>> meter = SpendMeter()
        >>> meter.add("r", "reference", "shadow", 0.5, prompt_tokens=7, completion_tokens=3)
        >>> meter.add("r", "reference", "teacher_forcing", 0.25, prompt_tokens=12,
        ...           completion_tokens=1)
        >>> meter.totals("r")["reference"]  # doctest: +NORMALIZE_WHITESPACE
        {'calls': 2, 'tokens': 23, 'seconds': 0.75, 'teacher_forcing_calls': 1,
         'unmetered': 0}
        """
        out: dict[str, dict[str, float]] = {}
        for (r, side, purpose), spent in self._spent.items():
            if r != route:
                continue
            row = out.setdefault(side, dict.fromkeys(TOTALS, 0))
            row["calls"] += spent.calls
            row["tokens"] += spent.prompt_tokens + spent.completion_tokens
            row["seconds"] = round(row["seconds"] + spent.seconds, 6)
            row["unmetered"] += spent.unmetered
            if purpose == "teacher_forcing":
                row["teacher_forcing_calls"] += spent.calls
        return out

    def view(self, route: str) -> dict[str, dict[str, dict[str, Any]]]:
        """Per side and purpose, the route's totals (``/health``)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (r, side, purpose), spent in sorted(self._spent.items()):
            if r == route:
                row = asdict(spent)
                row["seconds"] = round(spent.seconds, 6)
                out.setdefault(side, {})[purpose] = row
        return out

    def collect(self) -> Iterator[Any]:
        """The Prometheus families (``quantdrift_gateway_shadow_spend_*``)."""
        labels = ["route", "side", "purpose"]
        items = self._spent.items()
        yield counter(
            "shadow_spend_calls",
            "upstream calls made for shadowing (not user traffic)",
            labels,
            {k: s.calls for k, s in items},
        )
        yield counter(
            "shadow_spend_tokens",
            "tokens the upstream reported for shadowing calls (not user traffic)",
            [*labels, "type"],
            {
                **{(*k, "prompt"): s.prompt_tokens for k, s in items},
                **{(*k, "completion"): s.completion_tokens for k, s in items},
            },
        )
        yield counter(
            "shadow_spend_seconds",
            "wall-clock seconds of shadowing calls (not user traffic)",
            labels,
            {k: s.seconds for k, s in items},
        )
        yield counter(
            "shadow_spend_unmetered",
            "shadowing calls whose tokens the upstream did not report",
            labels,
            {k: s.unmetered for k, s in items},
        )
