"""The information limit beside a detection delay: how few pairs an oracle would need.

A mode's median delay alone does not say whether the detectors leave power on the
table or the pairs carry no more. The limit is estimated on the very pairs the eval
judges, as an oracle would use them:

* **an oracle discriminant**: a logistic regression on every numeric metric a score
  carries (cosine, entropy shift, teacher-forced KL, length ratio, cap hits, distinct
  ratio, Jaccard, JSON validity against the reference, ...), fitted on the eval's
  healthy and broken pairs themselves, knowing which is which: optimistic on purpose,
  a bound to read a delay against, never a detector. Each pair is scored by the fit
  of the other folds (5-fold): fitted and scored on the same few hundred distinct
  pairs, the regression memorised them and put the limit at 2 to 6 pairs in every
  mode, a bound too loose to say anything.
* With balanced class weights its log-odds estimate the per-pair log-likelihood ratio
  ``log p_broken(x) / p_healthy(x)``; their mean over the broken pairs estimates
  ``KL(broken || healthy)`` per pair.
* Wald's approximation of a sequential test's expected sample size under the
  alternative, with the false-alarm level ``alpha``: ``log(1 / alpha) / KL``.

A stream has to wait for evidence of at least that many pairs, whatever the test; the
gap between a mode's median delay and this number is what a better test could win.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

ALPHA = 1e-4  # the oracle level: near the tolerance rule's per-route budget


def feature_rows(metrics: Sequence[Mapping[str, Any]]) -> tuple[list[str], np.ndarray]:
    """Numeric columns of the metric dicts: floats, ints and bools; a missing or NaN value
    is 0 with a ``name?`` presence column beside it (absence can itself be the signal).

    >>> names, x = feature_rows([{"a": 1.0, "b": None, "ok": True}, {"a": 2.0, "b": 0.5}])
    >>> names, x.tolist()
    (['a', 'b', 'b?', 'ok', 'ok?'], [[1.0, 0.0, 0.0, 1.0, 1.0], [2.0, 0.5, 1.0, 0.0, 0.0]])
    """
    columns = sorted(
        {name for row in metrics for name, v in row.items() if isinstance(v, bool | int | float)}
    )
    gappy = {name for name in columns if any(not _number(row.get(name)) for row in metrics)}
    names = [n for name in columns for n in ([name, f"{name}?"] if name in gappy else [name])]
    x = np.zeros((len(metrics), len(names)))
    for i, row in enumerate(metrics):
        j = 0
        for name in columns:
            v = row.get(name)
            if _number(v):
                x[i, j] = float(v)  # type: ignore[arg-type]
            j += 1
            if name in gappy:
                x[i, j] = 1.0 if _number(v) else 0.0
                j += 1
    return names, x


def _number(v: object) -> bool:
    return isinstance(v, bool | int | float) and not (isinstance(v, float) and math.isnan(v))


def information_limit(
    healthy: Sequence[Mapping[str, Any]],
    broken: Sequence[Mapping[str, Any]],
    alpha: float = ALPHA,
) -> float | None:
    """Pairs an oracle's sequential test needs on average to flag ``broken``: Wald's
    ``log(1/alpha) / KL``, KL from the fitted log-odds (module docstring). ``inf`` when
    the oracle finds no separation; None without pairs of both kinds.

    >>> rng = np.random.default_rng(0)
    >>> h = [{"cos": float(v)} for v in rng.normal(0.0, 1.0, 2000)]
    >>> b = [{"cos": float(v)} for v in rng.normal(1.0, 1.0, 2000)]
    >>> round(information_limit(h, b))  # KL(N(1,1) || N(0,1)) = 0.5: 2 ln(1e4) = 18.4
    17
    """
    # Deferred: scikit-learn takes about a second to import, paid only by an eval's limit.
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if not healthy or not broken:
        return None
    _, x = feature_rows([*healthy, *broken])
    keep = x.std(axis=0) > 0
    if not keep.any():
        return math.inf
    x = x[:, keep]
    y = np.r_[np.zeros(len(healthy)), np.ones(len(broken))]
    model = make_pipeline(
        StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=2000)
    )
    folds = StratifiedKFold(
        n_splits=min(5, len(healthy), len(broken)), shuffle=True, random_state=0
    )
    if folds.n_splits < 2:
        return None
    log_odds = cross_val_predict(model, x, y, cv=folds, method="decision_function")
    kl = float(np.mean(log_odds[len(healthy) :]))
    if kl <= 0:
        return math.inf
    return math.log(1 / alpha) / kl
