"""The decision: fold one score into a route's state. Pure, no I/O, no clock.

Every rule of the decision is here, in the order the policy lists them; the
first that fires wins. The Redis store (``store.py``) and the in-memory store
(``memory.py``) only read, call ``judge``/``tick`` and write back.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantdrift.breaker import rules
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.rules import signal_arl
from quantdrift.breaker.state import BreakerState, RouteState, Transition, WorstPair
from quantdrift.detectors.noise_floor import NoiseFloor, NoiseFloorState, metric_values
from quantdrift.detectors.sequential import ECusum, ECusumState
from quantdrift.schemas.command import Target
from quantdrift.schemas.score import ScoreEvent


@dataclass(frozen=True, slots=True)
class Decision:
    state: RouteState
    transition: Transition | None = None


def similarity_of(score: ScoreEvent) -> float | None:
    """Cosine when the embedder ran, else ROUGE-L: the window rule needs one number."""
    m = score.metrics
    return m.cosine if m.cosine is not None else m.rougeL


def judged_by_similarity(policy: RoutePolicy, score: ScoreEvent) -> bool:
    """Absolute similarity means something for greedy pairs; for sampled ones only
    when the policy says so (``fixed_rules_on_sampled``): two samples of the same
    model already disagree far below any fixed threshold."""
    return score.decoding == "greedy" or policy.fixed_rules_on_sampled


def is_failure(score: ScoreEvent, policy: RoutePolicy | None = None) -> bool:
    """The seeds' failure: the per-pair verdict (cosine, entropy, loop, JSON) is not ok.

    With a policy, a sampled pair not judged by similarity fails only as an anomaly.
    """
    if policy is not None and not judged_by_similarity(policy, score):
        return score.verdict == "anomaly"
    return score.verdict != "ok"


def initial_state(policy: RoutePolicy) -> RouteState:
    return RouteState(target="candidate", cooldown_s=policy.cooldown_s)


def next_epoch(last: int, now: float) -> int:
    """A hybrid logical clock: one more than the last epoch, and never below ``now`` in ms.

    Gateways apply only commands newer than the last they applied. A counter kept in
    Redis restarts at 1 when Redis loses the route's state, and every gateway would
    then refuse the next rollback as stale; the wall clock in milliseconds keeps the
    epoch growing across that loss (as long as workers' clocks agree to within the
    time between two transitions of a route).

    >>> next_epoch(0, 1.5), next_epoch(1500, 1.5), next_epoch(7, 0.0)
    (1500, 1501, 8)
    """
    return max(last + 1, int(now * 1000))


def target_hint(policy: RoutePolicy, target: str) -> str | None:
    """The concrete precision the policy names for a role, if it names one."""
    return policy.reference_precision if target == "reference" else policy.candidate_precision


def judge(
    policy: RoutePolicy,
    state: RouteState,
    score: ScoreEvent,
    now: float,
    floor: NoiseFloorState | None = None,
    noise_floor: NoiseFloor = NoiseFloor(),
) -> Decision:
    """Fold one shadow score into the route's state; noise scores never reach here."""
    if not state.target:
        state = state.evolve(target="candidate", cooldown_s=policy.cooldown_s)
    failing = is_failure(score, policy)
    similarity = similarity_of(score)
    state = state.evolve(
        pairs_seen=state.pairs_seen + 1,
        last_similarity=similarity,
        updated_at=now,
        worst=_worst(state.worst, score, similarity, policy.worst_pairs_kept),
    )
    if state.locked or state.state == "open":
        # Locked routes follow the operator; open routes serve the reference, and
        # candidate pairs still in flight from before the trip say nothing new.
        return Decision(state.evolve(last_decision="ignored"))
    if state.state == "half_open":
        return _probe(policy, state, failing, score)
    return _closed(policy, state, score, failing, similarity, floor, noise_floor, now)


def _closed(
    policy: RoutePolicy,
    state: RouteState,
    score: ScoreEvent,
    failing: bool,
    similarity: float | None,
    floor: NoiseFloorState | None,
    noise_floor: NoiseFloor,
    now: float,
) -> Decision:
    consecutive = state.consecutive_failures + 1 if failing else 0
    # With teacher-forced evidence the window averages that divergence, not the text
    # similarity: a healthy int8 route's greedy cosines hover around 0.85 (near-ties
    # amplified), so one broken pair would tip a similarity window over the bar.
    tf = score.metrics.tf_kl if policy.teacher_forced else None
    windowed = similarity if judged_by_similarity(policy, score) and tf is None else None
    entry = (windowed, score.verdict == "anomaly", tf)
    window = (*state.window, entry)[-policy.window_size :]
    seq = ECusum(false_alarm_budget=signal_arl(policy, "sequential") or 2.0)
    seq_state = ECusumState(state.seq_n, state.seq_log_m)
    p = None
    if floor is not None and "sequential" in policy.rules:
        p = noise_floor.p_value(floor, metric_values(score.metrics), policy.min_noise_pairs)
    seq_signal = None
    if p is not None:
        seq_state, seq_signal = seq.update(seq_state, p)
    # The tolerance tests run from the first pair; min_pairs only holds the alarm
    # back, and a crossing before it is kept in ``early`` (never discarded).
    tests, crossed = dict(state.tests), list[rules.Fired]()
    if "tolerance" in policy.rules:
        tests, crossed = rules.step(policy, state.tests, score, floor)
    early = state.early or (crossed[0].signal if crossed else "")
    state = state.evolve(
        consecutive_failures=consecutive,
        window=window,
        seq_n=seq_state.n,
        seq_log_m=seq_state.log_m,
        last_decision="ok" if not failing else score.verdict,
        tests=tests,
        early=early,
    )
    if state.pairs_seen < policy.min_pairs:
        return Decision(state)
    sims = [w[0] for w in window if w[0] is not None]
    mean_sim = sum(sims) / len(sims) if sims else None
    # Each pair's divergence counts up to 1 nat: one wild pair in a healthy window
    # must not carry the mean over the bar alone (consecutive failures catch bursts).
    tfs = [min(w[2], 1.0) for w in window if w[2] is not None]
    mean_tf = sum(tfs) / len(tfs) if tfs else None
    anomaly_rate = sum(1 for w in window if w[1]) / len(window)
    for rule in policy.rules:
        fired: tuple[str, dict[str, object]] | None = None
        name: str = rule
        if rule == "consecutive" and consecutive >= policy.consecutive_failures:
            fired = (
                f"{consecutive} consecutive failing pairs (K={policy.consecutive_failures})",
                {"consecutive": consecutive, "last_reasons": list(score.reasons)},
            )
        elif rule == "window" and len(window) >= min(policy.window_size, policy.min_pairs):
            bar = (
                policy.window_mean_similarity
                if score.metrics.cosine is not None
                else policy.window_mean_lexical
            )
            if mean_sim is not None and mean_sim < bar:
                fired = (
                    f"window mean similarity {mean_sim:.3f} < {bar}",
                    {"mean_similarity": round(mean_sim, 4), "window": len(window)},
                )
            elif mean_tf is not None and mean_tf > policy.tf_kl_threshold:
                fired = (
                    f"window mean teacher-forced KL {mean_tf:.3f} > {policy.tf_kl_threshold:g}",
                    {"mean_tf_kl": round(mean_tf, 4), "window": len(window)},
                )
            elif anomaly_rate > policy.window_anomaly_rate:
                fired = (
                    f"window anomaly rate {anomaly_rate:.1%} > {policy.window_anomaly_rate:.1%}",
                    {"anomaly_rate": round(anomaly_rate, 4), "window": len(window)},
                )
        elif rule == "tolerance" and (crossed or early):
            first = crossed[0] if crossed else None
            signal = first.signal if first else early
            fired = (
                first.reason if first else f"{signal}: crossed before min_pairs, kept",
                {
                    **(first.evidence if first else {"signal": signal, "early": True}),
                    "tests": rules.summary(tests),
                },
            )
            name = f"tolerance:{signal}"
        elif rule == "sequential" and seq_signal is not None and seq_signal.drift_detected:
            fired = (
                f"e-CUSUM log M {seq_signal.statistic:.2f} >= {seq.threshold:.2f}",
                {"log_m": round(seq_signal.statistic, 3), "threshold": round(seq.threshold, 3)},
            )
        if fired is not None:
            reason, numbers = fired
            effects = {}
            if floor is not None:
                effects = noise_floor.effect_sizes(floor, metric_values(score.metrics))
            numbers = {**numbers, "decisive_pair_id": score.pair_id, "effect_sizes": effects}
            return _trip(policy, state, name, reason, numbers, now)
    return Decision(state)


def _trip(
    policy: RoutePolicy,
    state: RouteState,
    rule: str,
    reason: str,
    numbers: dict[str, object],
    now: float,
) -> Decision:
    from_state = state.state
    cooldown = policy.cooldown_s if from_state == "closed" else state.cooldown_s
    if from_state == "half_open":
        cooldown = min(state.cooldown_s * policy.cooldown_backoff, policy.max_cooldown_s)
    evidence = {
        **numbers,
        "rule": rule,
        "pairs_seen": state.pairs_seen,
        "cooldown_s": cooldown,
        "worst_pairs": [
            {"pair_id": w.pair_id, "similarity": w.similarity, "reasons": list(w.reasons)}
            for w in state.worst
        ],
    }
    new = _reset_counters(state).evolve(
        state="open",
        epoch=next_epoch(state.epoch, now),
        target="reference",
        opened_at=now,
        cooldown_s=cooldown,
        trips=state.trips + 1,
        last_decision=f"trip:{rule}",
    )
    return Decision(
        new,
        Transition(
            from_state,
            "open",
            "rollback",
            "reference",
            rule,
            reason,
            evidence,
            target_hint(policy, "reference"),
        ),
    )


def _probe(policy: RoutePolicy, state: RouteState, failing: bool, score: ScoreEvent) -> Decision:
    """Half-open: the candidate runs in shadow behind the reference and must prove itself."""
    if failing:
        reason = "half-open probe failed: " + ", ".join(score.reasons or [score.verdict])
        return _trip(
            policy,
            state,
            "half_open_probe",
            reason,
            {"decisive_pair_id": score.pair_id},
            state.updated_at,
        )
    passes = state.half_open_passes + 1
    if passes < policy.half_open_pairs:
        return Decision(state.evolve(half_open_passes=passes, last_decision="probe_pass"))
    new = _reset_counters(state).evolve(
        state="closed",
        epoch=next_epoch(state.epoch, state.updated_at),
        target="candidate",
        opened_at=None,
        cooldown_s=policy.cooldown_s,
        last_decision="restored",
    )
    reason = f"{passes} passing shadow pairs in half-open"
    return Decision(
        new,
        Transition(
            "half_open",
            "closed",
            "restore",
            "candidate",
            "half_open_probe",
            reason,
            {"passes": passes},
            target_hint(policy, "candidate"),
        ),
    )


def tick(policy: RoutePolicy, state: RouteState, now: float) -> Decision:
    """Time passing: an open route whose cool-down is over goes half-open."""
    if state.locked or state.state != "open" or state.opened_at is None:
        return Decision(state)
    if now - state.opened_at < state.cooldown_s:
        return Decision(state)
    new = _reset_counters(state).evolve(
        state="half_open",
        epoch=next_epoch(state.epoch, now),
        last_decision="half_open",
        updated_at=now,
    )
    reason = f"cool-down of {state.cooldown_s:g} s over: candidate runs in shadow"
    return Decision(
        new,
        Transition(
            "open",
            "half_open",
            "canary",
            "reference",
            "cooldown",
            reason,
            {"cooldown_s": state.cooldown_s, "percent": 0.0},
            target_hint(policy, "reference"),
        ),
    )


def manual(
    policy: RoutePolicy, state: RouteState, action: str, now: float, who: str = "cli"
) -> Decision:
    """An operator's rollback / restore (locks the route) or release (unlocks it)."""
    if not state.target:
        state = initial_state(policy)
    if action == "release":
        new = state.evolve(
            locked=False,
            epoch=next_epoch(state.epoch, now),
            last_decision="released",
            updated_at=now,
        )
        side: Target = "candidate" if new.state == "closed" else "reference"
        transition = Transition(
            state.state,
            new.state,
            "restore" if new.state == "closed" else "rollback",
            side,
            "manual",
            f"lock released by {who}",
            {"who": who},
            target_hint(policy, side),
        )
        return Decision(new, transition)
    to_state: BreakerState = "open" if action == "rollback" else "closed"
    target: Target = "reference" if action == "rollback" else "candidate"
    new = _reset_counters(state).evolve(
        state=to_state,
        epoch=next_epoch(state.epoch, now),
        target=target,
        locked=True,
        opened_at=now if to_state == "open" else None,
        last_decision=f"manual:{action}",
        updated_at=now,
    )
    transition = Transition(
        state.state,
        to_state,
        "rollback" if action == "rollback" else "restore",
        target,
        "manual",
        f"manual {action} by {who}; route locked",
        {"who": who},
        target_hint(policy, target),
    )
    return Decision(new, transition)


def _reset_counters(state: RouteState) -> RouteState:
    return state.evolve(
        consecutive_failures=0,
        window=(),
        seq_n=0,
        seq_log_m=0.0,
        half_open_passes=0,
        worst=(),
        tests={},
        early="",
    )


def _worst(
    worst: tuple[WorstPair, ...], score: ScoreEvent, similarity: float | None, keep: int
) -> tuple[WorstPair, ...]:
    """Keep the ``keep`` worst pairs since the last transition: alerts show them."""
    if keep == 0 or (score.verdict == "ok" and similarity is None):
        return worst
    entry = WorstPair(score.pair_id, similarity, tuple(score.reasons))

    def badness(w: WorstPair) -> tuple[int, float]:
        return (0 if w.reasons else 1, w.similarity if w.similarity is not None else 1.0)

    return tuple(sorted((*worst, entry), key=badness)[:keep])
