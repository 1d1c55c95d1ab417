"""Tolerance tests: "is the candidate worse than the reference by more than δ?".

A test of *identity* ("the candidate behaves like the reference") eventually
rolls back every healthy quantized model, because every one differs a little.
The question a route owner asks is whether the candidate is worse by more than
a tolerance δ they accept. Each signal here is one bounded number per pair,
``x`` in [0, 1], whose mean under a healthy candidate is at most a known
``null_mean`` (a floor's mean plus δ, or δ itself for paired outcomes):

* **outcomes**: the paired task outcome (JSON contract kept, loop-free,
  finished, and right where the pair carries a checkable answer) as
  ``(1 + cand_failed - ref_failed) / 2``: concordant pairs give
  1/2, so the reference's own failure rate cancels; null mean ``(1 + δ) / 2``
  = "the candidate's failure rate exceeds the reference's by at most δ". Where
  an operator blessed a candidate (``blessed:outcomes``, the same x on the
  blessed pairs), the null is "no worse than the blessed behaviour by more
  than δ": the blessed mean's exact upper bound plus δ / 2
  (:func:`blessed_outcome_mean`), never below the reference's null;
* **hard**: a hard failure the reference does not show (entropy collapse, a
  repetition loop, runaway whitespace), null mean δ = the tolerated rate; where an
  operator blessed a candidate (``blessed:hard``, the same x on the blessed pairs),
  the blessed rate's exact upper bound plus δ (:func:`blessed_hard_rate`): a build
  that loops on a prompt now and then was blessed with that habit;
* **tf_kl**: teacher-forced divergence clipped to ``tf_kl_clip`` nats, scaled;
* **dissimilarity**: 1 - cosine of the two answers' embeddings (needs an embedder);
* **lexical**: 1 - ROUGE-L F1 of the two answers' tokens. A test of its own beside
  the cosine, not a fallback: greedy answers of a broken candidate keep the meaning
  and lose the wording (greedy int4 on the lab's 40-prompt set, text only, when the
  test was added: p90 99 pairs with the cosine alone, 43 with this test beside it);
* **entropy**: |entropy shift| clipped to ``entropy_clip`` nats, scaled.

Each is tested by :class:`BettingSR`, an e-detector (Shin, Ramdas & Rinaldo,
"E-detectors", 2022) built from betting e-values for a bounded mean
(Waudby-Smith & Ramdas, "Estimating means of bounded random variables by
betting", 2023): its mean run length to a false alarm is at least the
``arl`` it is given, however often it is looked at. The route's one budget is
split among the signals (``RoutePolicy.budget_split``): a signal with share
``w`` gets ``arl = budget / w``, so the false-alarm rates add up to at most
one per ``budget`` pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from quantdrift.detectors.noise_floor import LOWER_IS_WORSE, resolution
from quantdrift.detectors.sequential import Signal
from quantdrift.detectors.suite import FailureThresholds, hard_failures
from quantdrift.schemas.score import Metrics

SIGNALS = ("hard", "outcomes", "tf_kl", "dissimilarity", "lexical", "entropy")
DIVERGENCES = ("tf_kl", "dissimilarity", "lexical", "entropy")

BLESSED = "blessed:"
# The floor key of the blessed pairs' outcome x (calibration writes it, the rule reads it).
BLESSED_OUTCOMES = BLESSED + "outcomes"
# The floor key of the blessed pairs' hard-failure x (1 or 0), written and read alike.
BLESSED_HARD = BLESSED + "hard"
# One-sided level of every calibration bound (the blessed outcome rate, a divergence
# floor's mean): the chance, paid once per calibration, that it sits below the truth.
CALIBRATION_ALPHA = 0.025
# How much more (or less) often live traffic may bring any kind of prompt than the
# calibration pairs did: a divergence floor's mean is bounded over every traffic mix
# whose density against the calibration's stays within [1 / ratio, ratio]. 1.5 covers
# a task family at 40 % of the calibration and 60 % of the traffic. The default of a
# route policy's ``calibration_mix_ratio``.
CALIBRATION_MIX_RATIO = 1.5


def _softplus(v: float) -> float:
    """log(1 + e^v), stable for large |v|."""
    return v + math.log1p(math.exp(-v)) if v > 0 else math.log1p(math.exp(v))


def _log_mean_exp(values: Sequence[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(v - top) for v in values) / len(values))


@dataclass(frozen=True, slots=True)
class BettingState:
    """Pairs seen, the sum of x (for evidence), and log R per bet size."""

    n: int = 0
    total: float = 0.0
    log_r: tuple[float, ...] = ()

    def to_json(self) -> list[float]:
        return [float(self.n), self.total, *self.log_r]

    @classmethod
    def from_json(cls, data: Sequence[float] | None) -> BettingState:
        if not data or len(data) < 2:
            return cls()
        return cls(int(data[0]), float(data[1]), tuple(float(v) for v in data[2:]))

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass(frozen=True, slots=True)
class BettingSR:
    """Shiryaev-Roberts e-detector on betting e-values, H0: E[x | past] <= null_mean.

    Each pair brings, for every bet size ``lam = f / null_mean`` (``f`` in
    ``fractions``), the e-value ``1 + lam * (x - null_mean)`` (>= 1 - f > 0, mean
    <= 1 under H0, large when x sits above the null mean). Per bet size the
    detector runs ``R_n = e_n * (1 + R_{n-1})`` (the sum over every possible
    change point of the product since it), and alarms when the *average* over
    bet sizes reaches ``arl``. An average of e-detectors is an e-detector, and an
    e-detector with threshold A has mean run length to a false alarm >= A: so
    ``arl`` is the budget itself, not a tuned number. ``null_mean`` may change
    from pair to pair (a floor that moves) as long as it is fixed before x is seen.

    Examples
    --------
    >>> test = BettingSR(arl=1e4)
    >>> state, alarms = test.init(), []
    >>> for i, x in enumerate([0.05] * 200 + [0.6] * 20):
    ...     state, signal = test.update(state, x, null_mean=0.1)
    ...     if signal.drift_detected:
    ...         alarms.append(i)
    ...         state = test.init()
    >>> alarms[:2]
    [205, 211]
    """

    arl: float = 1e6
    fractions: tuple[float, ...] = (0.05, 0.15, 0.35, 0.65, 0.95)
    min_instances: int = 1

    def __post_init__(self) -> None:
        if self.arl <= 1:
            raise ValueError(f"arl must be > 1, got {self.arl}")
        if not self.fractions or not all(0 < f < 1 for f in self.fractions):
            raise ValueError("fractions must be in (0, 1)")

    @property
    def threshold(self) -> float:
        return math.log(self.arl)

    def init(self) -> BettingState:
        return BettingState()

    def update(
        self, state: BettingState, x: float, null_mean: float
    ) -> tuple[BettingState, Signal]:
        x = min(1.0, max(0.0, float(x)))
        previous = state.log_r if len(state.log_r) == len(self.fractions) else None
        log_r = []
        for k, f in enumerate(self.fractions):
            if null_mean >= 1.0:
                log_e = 0.0  # nothing can exceed a null mean of 1: no bet
            else:
                m = max(null_mean, 1e-6)
                log_e = math.log1p(f / m * (x - m))
            before = previous[k] if previous is not None else -math.inf
            log_r.append(log_e + (0.0 if before == -math.inf else _softplus(before)))
        stat = _log_mean_exp(log_r)
        n = state.n + 1
        new = BettingState(n, state.total + x, tuple(log_r))
        drift = n >= self.min_instances and stat >= self.threshold
        return new, Signal(drift, stat, self.threshold)

    def growth(
        self, outcomes: Sequence[tuple[float, float]], null_mean: float
    ) -> tuple[float, float]:
        """(g, step) of the best bet size when x is drawn from ``outcomes`` ((value,
        probability) pairs): ``g = E[log e]`` per pair, the largest the bet sizes reach,
        and that bet's largest one-pair log e-value. ``g <= 0``: no bet grows.

        >>> g, step = BettingSR().growth([(1.0, 0.3), (0.0, 0.7)], null_mean=0.02)
        >>> round(g, 3), round(step, 2)
        (0.568, 2.9)
        """
        best, step = -math.inf, 0.0
        if null_mean >= 1.0:
            return best, step
        m = max(null_mean, 1e-6)
        for f in self.fractions:
            logs = [(p, math.log1p(f / m * (min(1.0, max(0.0, x)) - m))) for x, p in outcomes]
            g = sum(p * v for p, v in logs if p > 0)
            if g > best:
                best, step = g, max(v for _, v in logs)
        return best, step

    def expected_delay(
        self, outcomes: Sequence[tuple[float, float]], null_mean: float
    ) -> float | None:
        """Expected pairs to the alarm when every pair's x is drawn from ``outcomes``
        from the first pair on (None: no bet grows, the alarm is not expected).

        Wald's identity for the best bet size: its log e-process grows by ``g`` a pair
        and stops at the threshold ``log arl`` plus the mean overshoot, taken as half
        its largest step. The Shiryaev-Roberts sum starts ``log 1 / (1 - e^-g)`` ahead
        of the plain product (each earlier change point discounted by ``e^-g`` a pair).
        An analytic approximation, not a bound: bench/shadow_cost.py sets it beside the
        delays the breaker's fold measures.

        >>> round(BettingSR(arl=8e6).expected_delay([(1.0, 0.3), (0.0, 0.7)], 0.02), 1)
        29.1
        """
        g, step = self.growth(outcomes, null_mean)
        if g <= 0:
            return None
        head_start = -math.log1p(-math.exp(-g))
        return max(0.0, self.threshold + step / 2.0 - head_start) / g


# --- per-pair signals ----------------------------------------------------------------------


def task_failed(
    json_ok: bool | None,
    looping: bool | None,
    finished: bool | None,
    answer_ok: bool | None = None,
) -> bool:
    """A task outcome failed: broken JSON contract, a looping tail, cut off at max_tokens,
    or, where the pair carries a checkable answer, a wrong one (detectors/correctness.py)."""
    return json_ok is False or looping is True or finished is False or answer_ok is False


def hard_x(m: Metrics, thresholds: FailureThresholds) -> float:
    """1 when the candidate shows a hard failure the reference does not, else 0: the
    hard test's x, on live pairs and on blessed ones alike."""
    return 1.0 if hard_failures(m, thresholds) else 0.0


def outcome_x(m: Metrics) -> float:
    """(1 + candidate failed - reference failed) / 2: 1/2 for concordant pairs.

    >>> outcome_x(Metrics(json_ok=False, reference_json_ok=True))
    1.0
    >>> outcome_x(Metrics(looping=True, reference_looping=True))
    0.5
    >>> outcome_x(Metrics(answer_ok=False, reference_answer_ok=True))  # wrong where it was right
    1.0
    """
    cand = task_failed(m.json_ok, m.looping, m.finished, m.answer_ok)
    ref = task_failed(
        m.reference_json_ok, m.reference_looping, m.reference_finished, m.reference_answer_ok
    )
    return (1 + int(cand) - int(ref)) / 2


def divergence_x(m: Metrics, signal: str, tf_kl_clip: float, entropy_clip: float) -> float | None:
    """The pair's bounded divergence for ``signal``, or None when the pair lacks it."""
    if signal == "tf_kl":
        return None if m.tf_kl is None else clip_metric("tf_kl", m.tf_kl, tf_kl_clip)
    if signal == "dissimilarity":
        return None if m.cosine is None else clip_metric("cosine", m.cosine)
    if signal == "lexical":
        return None if m.rougeL is None else clip_metric("rougeL", m.rougeL)
    if signal == "entropy":
        if m.entropy_shift is None:
            return None
        return clip_metric("abs_entropy_shift", abs(m.entropy_shift), entropy_clip)
    raise ValueError(f"not a divergence signal: {signal!r}")


def floor_metric(m: Metrics, signal: str) -> str:
    """Which floor metric a divergence signal compares with for this pair."""
    if signal == "tf_kl":
        return "tf_kl"
    if signal == "dissimilarity":
        return "cosine"
    if signal == "lexical":
        return "rougeL"
    if signal == "entropy":
        return "abs_entropy_shift"
    raise ValueError(f"not a divergence signal: {signal!r}")


def clip_metric(metric: str, value: float, clip: float = 1.0) -> float:
    """A floor metric mapped onto [0, 1], larger = further from the reference: one minus
    a similarity (every metric where lower is worse), else the value over ``clip``.

    >>> clip_metric("jaccard", 0.25), clip_metric("tf_kl", 1.0, clip=4.0)
    (0.75, 0.25)
    """
    if metric in LOWER_IS_WORSE:
        return min(1.0, max(0.0, 1.0 - value))
    return min(1.0, max(0.0, value / clip))


def informative(values: Sequence[float], metric: str, min_count: int) -> bool:
    """Enough values, and a spread above the metric's resolution."""
    # Below the metric's resolution a floor says nothing (two greedy reference runs
    # agree to the last digit; two f32 runs of one model put tf_kl within 1e-5 nats).
    return len(values) >= min_count and max(values) - min(values) >= resolution(metric)


def floor_mean(
    floor: Mapping[str, Sequence[float]],
    metric: str,
    clip: float,
    min_count: int,
    ratio: float,
) -> tuple[float, str] | None:
    """(upper bound of the clipped floor mean, where it came from), or None (abstain).

    The blessed baseline first (``blessed:<metric>``: shadow pairs of a candidate the
    operator approved, collected exactly like live shadow pairs), then the noise
    pairs (reference vs reference), each only when informative (enough values, a
    spread above the metric's resolution). Neither: the signal abstains rather
    than trust a floor that cannot say how much disagreement is normal.

    The mean is bounded by :func:`mix_robust_upper` with the route's mix ``ratio``: a
    baseline of a few dozen prompts is itself a sample, drawn from a prompt mix that is
    not the traffic's, and a null mean set below the true healthy mean would be
    rejected by any sequential test given enough pairs.

    >>> floor_mean({"tf_kl": [0.0] * 40, "blessed:tf_kl": [0.01, 0.03] * 20}, "tf_kl", 1.0, 30, 1.5)
    (0.026257, 'blessed')
    >>> floor_mean({"tf_kl": [0.0] * 40}, "tf_kl", 1.0, 30, 1.5) is None
    True
    """
    for key, source in ((BLESSED + metric, "blessed"), (metric, "noise")):
        values = floor.get(key, ())
        if informative(values, metric, min_count):
            return _upper_mean(tuple(values), metric, clip, ratio), source
    return None


@lru_cache(maxsize=256)
def _upper_mean(values: tuple[float, ...], metric: str, clip: float, ratio: float) -> float:
    # Cached: the floor changes rarely, and the judge asks for every pair.
    clipped = [clip_metric(metric, v, clip) for v in values]
    return round(mix_robust_upper(clipped, ratio), 6)


def mix_robust_upper(
    values: Sequence[float],
    ratio: float = CALIBRATION_MIX_RATIO,
    alpha: float = CALIBRATION_ALPHA,
) -> float:
    """Upper bound of a floor's mean on traffic whose prompt mix is not the calibration's.

    Two things make the calibration mean too low, and the bound pays for both:

    * **the mix**: were the traffic's prompts drawn with a density within
      ``[1 / ratio, ratio]`` of the calibration's, its mean is at most the
      calibration's with weight ``ratio`` on the top ``1 / (ratio + 1)`` of the
      values and ``1 / ratio`` on the rest (the worst such reweighting, as in a
      marginal sensitivity model). The sample's version of that weighted mean is
      biased up, not down (a maximum over weights of a sample mean);
    * **the sample**: a one-sided Student t bound at ``alpha`` on the weighted
      values. A plug-in "mean + 2 SE" of skewed values (1 - cosine, KL) misses more
      often than it says: a sample whose mean came out low usually has a low
      spread too.

    It scales with the values' spread, not with their range: a floor of small,
    tight values (teacher-forced KL of a blessed int8) moves by a fraction of its
    tolerance, where an exact bound for any [0, 1] variable cannot be below
    ``1 - alpha ** (1 / n)`` above the mean (mass at 1 may hide in n pairs).
    What it assumes: the mean of ``n`` weighted values is close to normal (for
    ``n`` of a few dozen bounded values it is), and the mix moves within ``ratio``.

    >>> round(mix_robust_upper([0.1, 0.2] * 20), 4)  # mean 0.15
    0.1813
    >>> round(mix_robust_upper([0.3] * 40), 6)  # no spread: neither mix nor sample moves it
    0.3
    """
    if not values:
        raise ValueError("no values to bound")
    if ratio < 1.0:
        raise ValueError(f"ratio must be >= 1, got {ratio}")
    xs = sorted(values)
    n = len(xs)
    top = round(n / (ratio + 1.0))
    raw = [1.0 / ratio] * (n - top) + [ratio] * top
    scale = n / sum(raw)  # weights of mean 1: a reweighting, not a shift
    weights = [w * scale for w in raw]
    mean = sum(w * x for w, x in zip(weights, xs, strict=True)) / n
    if n < 2:
        return mean
    # The weighted mean's spread: each value's weighted deviation from it.
    var = sum((w * (x - mean)) ** 2 for w, x in zip(weights, xs, strict=True)) / (n - 1)
    return mean + student_t_quantile(1.0 - alpha, n - 1) * math.sqrt(var / n)


def _student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer ``df``: the closed forms of Abramowitz &
    Stegun 26.7.3-4 (finite sums in cos(atan(t / sqrt(df))))."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term, total = 1.0, 0.0
        if df > 1:
            total = term = math.cos(theta)
            for k in range(3, df - 1, 2):
                term *= c2 * (k - 1) / k
                total += term
        inside = 2.0 / math.pi * (theta + math.sin(theta) * total)
    else:
        term = total = 1.0
        for k in range(2, df - 1, 2):
            term *= c2 * (k - 1) / k
            total += term
        inside = math.sin(theta) * total
    return 0.5 + math.copysign(inside, t) / 2.0


@lru_cache(maxsize=1024)
def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom, ``p`` >= 1/2.

    By bisection on the exact CDF (no scipy below the breaker: detectors stay pure).

    >>> round(student_t_quantile(0.975, 20), 3), round(student_t_quantile(0.975, 1), 2)
    (2.086, 12.71)
    """
    if not 0.5 <= p < 1.0 or df < 1:
        raise ValueError(f"need 1/2 <= p < 1 and df >= 1, got p={p}, df={df}")
    hi = 1.0
    while _student_t_cdf(hi, df) < p:
        hi *= 2.0
    return _bisect(lambda t: _student_t_cdf(t, df) < p, 0.0, hi, 80)


def _bisect(root_above: Callable[[float], bool], lo: float, hi: float, steps: int) -> float:
    """The point in ``[lo, hi]`` where ``root_above`` turns False, halving ``steps`` times.

    The one root finder of this module's exact bounds (the t quantile, Clopper–Pearson):
    each passes a monotone test of whether its root lies above ``mid``.
    """
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if root_above(mid) else (lo, mid)
    return (lo + hi) / 2


# --- the blessed outcome baseline ---------------------------------------------------------


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in log space (n is a calibration's size)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k + 1)
    ]
    return min(1.0, math.exp(_log_mean_exp(terms)) * len(terms))


@lru_cache(maxsize=1024)
def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Exact one-sided (lower, upper) bounds of a binomial rate, each at level ``alpha``.

    Found by bisection on the binomial tail (no scipy below the breaker: detectors
    stay pure). The upper bound solves P(X <= k | p) = alpha, the lower one
    P(X >= k | p) = alpha.

    >>> [round(v, 4) for v in clopper_pearson(0, 40, 0.025)]
    [0.0, 0.0881]
    >>> [round(v, 4) for v in clopper_pearson(3, 40, 0.025)]
    [0.0157, 0.2039]
    """
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")

    def upper(j: int) -> float:
        if j == n:
            return 1.0
        # P(X <= j | p) falls from 1 at p = 0 to 0 at p = 1.
        return _bisect(lambda q: _binom_cdf(j, n, q) >= alpha, 0.0, 1.0, 60)

    # The lower bound of k successes is one minus the upper bound of n - k failures.
    return 1.0 - upper(n - k), upper(k)


def blessed_outcome_mean(
    floor: Mapping[str, Sequence[float]], min_count: int, alpha: float = CALIBRATION_ALPHA
) -> float | None:
    """Exact upper bound of the blessed candidate's mean outcome x, or None (no blessing).

    The blessed pairs' x is 1 where only the blessed candidate failed, 0 where only
    the reference did, 1/2 otherwise, so its mean is ``1/2 + (p_b - p_r) / 2``.
    Bounded as ``1/2 + (upper(p_b) - lower(p_r)) / 2``, each an exact
    Clopper-Pearson bound at ``alpha`` (together: at least ``1 - 2 alpha``). Two
    standard errors would not do here: a rare failure is often absent from a few
    dozen pairs, and a sample with none has no spread, so a plug-in bound would say
    the blessed candidate never fails more than the reference.

    >>> blessed_outcome_mean({"blessed:outcomes": [0.5] * 39 + [1.0]}, 10)
    0.565793
    >>> blessed_outcome_mean({"blessed:outcomes": [0.5] * 5}, 10) is None
    True
    """
    values = tuple(floor.get(BLESSED_OUTCOMES, ()))
    return None if len(values) < min_count else _outcome_upper(values, alpha)


@lru_cache(maxsize=256)
def _outcome_upper(values: tuple[float, ...], alpha: float) -> float:
    # Cached: the floor changes rarely, and the judge asks for every pair.
    n = len(values)
    only_blessed = sum(1 for v in values if v > 0.75)
    only_reference = sum(1 for v in values if v < 0.25)
    upper_b = clopper_pearson(only_blessed, n, alpha)[1]
    lower_r = clopper_pearson(only_reference, n, alpha)[0]
    return round(0.5 + (upper_b - lower_r) / 2.0, 6)


def blessed_hard_rate(
    floor: Mapping[str, Sequence[float]], min_count: int, alpha: float = CALIBRATION_ALPHA
) -> float | None:
    """Exact upper bound of the blessed candidate's hard-failure rate, or None (no blessing).

    The one-sided Clopper-Pearson bound at ``alpha`` of the blessed pairs with a hard
    failure the reference does not show. A blessed build that never failed in 40 pairs
    may still fail on 8.8 % of the traffic's prompts (a loop on one prompt of twenty
    that the calibration did not hold, as int8 did on vLLM), and the bound says so.

    >>> blessed_hard_rate({"blessed:hard": [0.0] * 40}, 10)
    0.088097
    >>> blessed_hard_rate({"blessed:hard": [0.0] * 5}, 10) is None
    True
    """
    values = tuple(floor.get(BLESSED_HARD, ()))
    if len(values) < min_count:
        return None
    failed = sum(1 for v in values if v > 0.5)
    return round(clopper_pearson(failed, len(values), alpha)[1], 6)
