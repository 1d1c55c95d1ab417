"""The per-pair verdict with teacher-forced evidence, and what the reference excuses."""

from __future__ import annotations

import pytest

from quantdrift.breaker.policy import RoutePolicy, failure_thresholds
from quantdrift.detectors import verdict
from quantdrift.detectors.suite import score_pairs
from quantdrift.schemas import Metrics, ModelOutput, PairEvent, RequestInfo


@pytest.mark.parametrize(
    "metrics, expected",
    [
        # A greedy near-tie: texts diverge, the reference finds the candidate's tokens as likely.
        (Metrics(cosine=0.54, tf_kl=0.003), ("ok", [])),
        (Metrics(cosine=0.99, tf_kl=0.30), ("drift", ["teacher-forced KL 0.300 > 0.1 nats"])),
        (Metrics(cosine=0.54), ("drift", ["cosine 0.54 < 0.88"])),
        # A JSON contract the reference breaks too is the prompt's, not quantization's.
        (
            Metrics(cosine=0.95, json_ok=False, json_error="json: x", reference_json_ok=False),
            ("ok", []),
        ),
        (
            Metrics(cosine=0.95, json_ok=False, json_error="json: x", reference_json_ok=True),
            ("anomaly", ["json: x"]),
        ),
    ],
)
def test_verdict(metrics: Metrics, expected: tuple[str, list[str]]) -> None:
    assert verdict(metrics) == expected


def test_seeds_policy_ignores_teacher_forced_evidence() -> None:
    seeds = failure_thresholds(RoutePolicy(teacher_forced=False))
    assert verdict(Metrics(cosine=0.54, tf_kl=0.003), seeds) == ("drift", ["cosine 0.54 < 0.88"])


def test_tf_kl_is_computed_from_both_sides_log_probs() -> None:
    pair = PairEvent(
        pair_id="p",
        ts=0.0,
        route="r",
        candidate=ModelOutput(text="a b", token_logprobs=[-0.1, -0.3]),
        reference=ModelOutput(text="a c"),
        request=RequestInfo(expects_json=True),
        reference_logprobs_on_candidate=[-0.5, -0.9],
    )
    (m,) = score_pairs([pair], None)
    assert m.tf_kl == pytest.approx(0.5)
    assert m.json_ok is False and m.reference_json_ok is False
