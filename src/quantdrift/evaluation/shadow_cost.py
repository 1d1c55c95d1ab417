"""What shadowing a route costs before it starts, and what the cost buys.

Pure: every figure comes from the arguments, nothing is measured here. From a
route's request rate, its token mix (prompt and completion tokens per request) and
the reference's measured speed (prompt and completion tokens per second of one
replica), :func:`estimate` gives, per shadow share:

* **the reference capacity the share costs.** Per request the reference runs
  ``s + q (2 - s)`` answers (``s`` the shadow share, ``q`` the noise share: a noise
  pair is two reference runs, one of them shared with the shadow pair when both are
  sampled, as the shadow runner's cache does), and, on a teacher-forced route, one
  forced pass per shadow pair over prompt + answer that generates one token. A route
  judging ``candidates`` builds side by side (its candidate and its
  ``extra_candidates``) still gets one reference answer per sampled request; each
  build adds only its forced pass. Tokens
  per second follow; the share of one replica is the seconds of prefill and decode at
  the measured rates, per second. That assumes the measured rates are what a replica
  sustains at its usual batch: a replica that batches shadow calls with user traffic
  pays less, one measured alone more.
* **the pairs per hour** it yields (shadow and noise).
* **the expected time to catch a drift**, in shadow pairs and in wall-clock time.

How the detection delay is estimated: analytically, from the e-process the judge
runs (``BettingSR.expected_delay`` in ``detectors/tolerance.py``: Wald's identity for
its best bet size, with the Shiryaev-Roberts head start and half a step of
overshoot), not by simulation. A drift is a signal and the rate the candidate shows
it at:

* ``hard=p``: a hard failure the reference does not show on a share ``p`` of the
  pairs (x is 1 with probability ``p``, else 0; null mean ``tolerance_hard``);
* ``outcomes=d``: the candidate fails ``d`` more of its tasks than the reference
  (x is 1 with probability ``d``, else 1/2: the reference's own failures are taken as
  concordant, which is the slowest case for a given ``d``; null ``(1 + δ) / 2``).

The test runs at ``arl``, the signal's share of the route's budget
(``breaker/rules/tolerance.signal_arl``: budget split and slices included). The
drift is taken as present from the first pair. ``bench/shadow_cost.py`` sets the
estimate beside the delays the breaker's own fold measures on synthetic scores;
tests/unit/test_shadow_cost.py holds them within a stated margin. A real drift
usually shows on several signals at once (a loop is a hard failure and a failed
task): the route trips on the first test to cross, so the estimate of one signal
is an upper bound for such a drift.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules.tolerance import paired_null, signal_arl
from quantdrift.detectors.tolerance import BettingSR

DRIFT_SIGNALS = ("hard", "outcomes")


@dataclass(frozen=True, slots=True)
class Traffic:
    """A route's load: requests per second and mean tokens per request."""

    requests_per_s: float
    prompt_tokens: float
    completion_tokens: float

    def __post_init__(self) -> None:
        _positive("requests_per_s", self.requests_per_s)
        _positive("prompt_tokens", self.prompt_tokens, zero=True)
        _positive("completion_tokens", self.completion_tokens)


@dataclass(frozen=True, slots=True)
class ReferenceSpeed:
    """One reference replica's measured prefill and decode rates (tokens per second)."""

    prompt_tokens_per_s: float
    completion_tokens_per_s: float

    def __post_init__(self) -> None:
        _positive("prompt_tokens_per_s", self.prompt_tokens_per_s)
        _positive("completion_tokens_per_s", self.completion_tokens_per_s)


@dataclass(frozen=True, slots=True)
class Drift:
    """A signal (``hard`` or ``outcomes``) and the rate the drifted candidate shows it at."""

    signal: str
    rate: float

    def __post_init__(self) -> None:
        if self.signal not in DRIFT_SIGNALS:
            raise ValueError(
                f"drift signal must be one of {', '.join(DRIFT_SIGNALS)}, got {self.signal!r}"
            )
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"drift rate must be in (0, 1], got {self.rate}")

    @property
    def label(self) -> str:
        return f"{self.signal}={self.rate:g}"


@dataclass(frozen=True, slots=True)
class Detection:
    """How soon the route's test of ``drift.signal`` catches it: expected shadow pairs
    (None: never: the drift is within the tolerance, or ``arl`` is None because the
    policy does not run that test) and the best bet size's growth per pair."""

    drift: Drift
    null_mean: float
    arl: float | None
    growth: float
    pairs: float | None

    @property
    def why_never(self) -> str:
        """Why ``pairs`` is None, in words (empty when it is not)."""
        if self.pairs is not None:
            return ""
        if self.arl is None:
            return "the policy does not run this test"
        return "within the tolerance"


@dataclass(frozen=True, slots=True)
class Spend:
    """What one shadow share costs the reference, and the pairs it yields."""

    share: float
    noise_share: float
    teacher_forced: bool
    candidates: int  # builds judged on each sampled request's one reference answer
    reference_prompt_tokens_per_s: float
    reference_completion_tokens_per_s: float
    replica_share: float  # of one reference replica's time
    shadow_pairs_per_hour: float
    noise_pairs_per_hour: float

    @property
    def reference_tokens_per_s(self) -> float:
        return self.reference_prompt_tokens_per_s + self.reference_completion_tokens_per_s


@dataclass(frozen=True, slots=True)
class Catch:
    """One drift at one share: expected shadow pairs and wall-clock seconds to catch it."""

    drift: str
    pairs: float | None
    seconds: float | None


@dataclass(frozen=True, slots=True)
class Estimate:
    """Per share, its spend and the time to catch each drift."""

    traffic: Traffic
    reference: ReferenceSpeed
    detections: tuple[Detection, ...]
    rows: tuple[tuple[Spend, tuple[Catch, ...]], ...]


def _positive(name: str, value: float, zero: bool = False) -> None:
    ok = math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>= 0' if zero else '> 0'}, got {value}")


def spend(
    traffic: Traffic,
    reference: ReferenceSpeed,
    share: float,
    noise_share: float = 0.0,
    teacher_forced: bool = False,
    candidates: int = 1,
) -> Spend:
    """The reference capacity a shadow share costs (module docstring).

    >>> t = Traffic(requests_per_s=10, prompt_tokens=500, completion_tokens=100)
    >>> s = spend(t, ReferenceSpeed(5000, 100), share=0.1)
    >>> s.reference_prompt_tokens_per_s, s.reference_completion_tokens_per_s, s.replica_share
    (500.0, 100.0, 1.1)
    >>> s.shadow_pairs_per_hour
    3600.0
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share}")
    if not 0.0 <= noise_share <= 1.0:
        raise ValueError(f"noise share must be in [0, 1], got {noise_share}")
    runs = share + noise_share * (2.0 - share)  # reference answers per request
    if candidates < 1:
        raise ValueError(f"candidates must be at least 1, got {candidates}")
    forced = share * candidates if teacher_forced else 0.0  # forced passes per request
    rate = traffic.requests_per_s
    prompt = rate * (
        runs * traffic.prompt_tokens + forced * (traffic.prompt_tokens + traffic.completion_tokens)
    )
    completion = rate * (runs * traffic.completion_tokens + forced * 1.0)
    busy = prompt / reference.prompt_tokens_per_s + completion / reference.completion_tokens_per_s
    return Spend(
        share=share,
        noise_share=noise_share,
        teacher_forced=teacher_forced,
        candidates=candidates,
        reference_prompt_tokens_per_s=prompt,
        reference_completion_tokens_per_s=completion,
        replica_share=busy,
        shadow_pairs_per_hour=rate * share * 3600.0,
        noise_pairs_per_hour=rate * noise_share * 3600.0,
    )


def _outcomes(drift: Drift) -> tuple[tuple[float, float], ...]:
    """The drift's distribution of x: (value, probability) pairs."""
    if drift.signal == "hard":
        return ((1.0, drift.rate), (0.0, 1.0 - drift.rate))
    return ((1.0, drift.rate), (0.5, 1.0 - drift.rate))


def detection(policy: RoutePolicy, drift: Drift) -> Detection:
    """Expected shadow pairs until the route's test of ``drift.signal`` crosses
    (module docstring); ``pairs`` None when the drift is within the tolerance or the
    policy does not run that test.

    >>> d = detection(RoutePolicy(), Drift("hard", 0.3))
    >>> d.null_mean, d.arl, round(d.pairs)
    (0.02, 8000000.0, 29)
    >>> detection(RoutePolicy(), Drift("hard", 0.01)).why_never
    'within the tolerance'
    >>> detection(RoutePolicy(rules=("consecutive",)), Drift("hard", 0.5)).why_never
    'the policy does not run this test'
    """
    arl = signal_arl(policy, drift.signal)
    m = paired_null(policy, drift.signal)
    dist = _outcomes(drift)
    if arl is None or sum(x * p for x, p in dist) <= m:
        return Detection(drift, m, arl, 0.0, None)
    test = BettingSR(arl=arl)
    growth, _ = test.growth(dist, m)
    pairs = test.expected_delay(dist, m)
    if pairs is None:
        return Detection(drift, m, arl, growth, None)
    return Detection(drift, m, arl, growth, max(float(policy.min_pairs), pairs))


def catch(found: Detection, spent: Spend, traffic: Traffic) -> Catch:
    """The detection at a share: pairs, and seconds at the share's pair rate."""
    if found.pairs is None:
        return Catch(found.drift.label, None, None)
    per_s = traffic.requests_per_s * spent.share
    return Catch(found.drift.label, found.pairs, found.pairs / per_s)


def share_within(found: Detection, traffic: Traffic, seconds: float) -> float | None:
    """The smallest shadow share that catches the drift within ``seconds`` on average
    (None: never, or more than all the traffic).

    >>> t = Traffic(requests_per_s=1, prompt_tokens=100, completion_tokens=10)
    >>> found = detection(RoutePolicy(), Drift("hard", 0.3))
    >>> round(share_within(found, t, 3600.0), 4)
    0.0081
    """
    _positive("seconds", seconds)
    if found.pairs is None:
        return None
    need = found.pairs / (traffic.requests_per_s * seconds)
    return need if need <= 1.0 else None


def estimate(
    policy: RoutePolicy,
    traffic: Traffic,
    reference: ReferenceSpeed,
    shares: Sequence[float],
    drifts: Sequence[Drift],
    noise_share: float = 0.0,
    teacher_forced: bool = False,
    candidates: int = 1,
) -> Estimate:
    """Spend and time to catch, for every share and drift."""
    if not shares:
        raise ValueError("at least one share")
    found = tuple(detection(policy, d) for d in drifts)
    rows = []
    for share in shares:
        spent = spend(traffic, reference, share, noise_share, teacher_forced, candidates)
        rows.append((spent, tuple(catch(f, spent, traffic) for f in found)))
    return Estimate(traffic, reference, found, tuple(rows))


def parse_drift(text: str) -> Drift:
    """``SIGNAL=RATE`` (e.g. ``hard=0.1``) as a :class:`Drift`; ValueError says why not.

    >>> parse_drift("outcomes=0.15")
    Drift(signal='outcomes', rate=0.15)
    """
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"drift {text!r}: expected SIGNAL=RATE, e.g. hard=0.1")
    try:
        rate = float(value)
    except ValueError:
        raise ValueError(f"drift {text!r}: {value!r} is not a number") from None
    return Drift(name.strip(), rate)
