"""The seeds' windowed rule: mean similarity, mean teacher-forced KL or anomaly rate
over the last ``size`` shadow pairs."""

from __future__ import annotations

from dataclasses import dataclass

from quantdrift.breaker.rules.reading import Fired, Pair

# (similarity or None, anomaly, teacher-forced KL or None) of one pair.
Entry = tuple[float | None, bool, float | None]


@dataclass(frozen=True, slots=True)
class WindowState:
    entries: tuple[Entry, ...] = ()


@dataclass(frozen=True, slots=True)
class Window:
    """Alarms on the window's means once it holds ``min_len`` pairs.

    The similarity bar is the cosine one when the pair carries a cosine, else the
    lexical one (ROUGE-L sits far lower on healthy traffic). Each pair's divergence
    counts up to 1 nat: one wild pair in a healthy window must not carry the mean
    over the bar alone (consecutive failures catch bursts).
    """

    size: int = 50
    min_len: int = 20
    mean_similarity: float = 0.85
    mean_lexical: float = 0.35
    tf_kl: float = 0.1
    anomaly_rate: float = 0.10

    def init(self) -> WindowState:
        return WindowState()

    def update(self, state: WindowState, pair: Pair) -> tuple[WindowState, Fired | None]:
        window = (*state.entries, (pair.windowed, pair.anomaly, pair.tf_kl))[-self.size :]
        new = WindowState(window)
        if len(window) < self.min_len:
            return new, None
        sims = [w[0] for w in window if w[0] is not None]
        mean_sim = sum(sims) / len(sims) if sims else None
        tfs = [min(w[2], 1.0) for w in window if w[2] is not None]
        mean_tf = sum(tfs) / len(tfs) if tfs else None
        anomaly_rate = sum(1 for w in window if w[1]) / len(window)
        bar = self.mean_similarity if pair.score.metrics.cosine is not None else self.mean_lexical
        if mean_sim is not None and mean_sim < bar:
            return new, Fired(
                "window",
                f"window mean similarity {mean_sim:.3f} < {bar}",
                {"mean_similarity": round(mean_sim, 4), "window": len(window)},
            )
        if mean_tf is not None and mean_tf > self.tf_kl:
            return new, Fired(
                "window",
                f"window mean teacher-forced KL {mean_tf:.3f} > {self.tf_kl:g}",
                {"mean_tf_kl": round(mean_tf, 4), "window": len(window)},
            )
        if anomaly_rate > self.anomaly_rate:
            return new, Fired(
                "window",
                f"window anomaly rate {anomaly_rate:.1%} > {self.anomaly_rate:.1%}",
                {"anomaly_rate": round(anomaly_rate, 4), "window": len(window)},
            )
        return new, None
