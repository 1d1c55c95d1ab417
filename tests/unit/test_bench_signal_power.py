"""bench/signal_power.py on the committed traffic corpus, small: the JSON, the section,
and what it says (about ten seconds of CPU with the static embedder)."""

from __future__ import annotations

from pathlib import Path

import pytest
import signal_power  # bench/ is not a package

from support.bench import rows_by_signal, write_section


@pytest.mark.slow  # scores the corpus: CI's `make test` runs it, `make test-fast` does not
def test_a_small_run_gives_every_signal_under_one_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--draws", "8", "--embedder", "static"]
    heading = "Would another signal call int4 sooner?"
    result, text = write_section(signal_power.main, heading, argv, tmp_path, capsys)
    rows = rows_by_signal(result, "corpus")
    # Every mode has the text signals, current and not; the corpus carries vLLM's
    # log-probs and teacher forcing, so those signals are there too.
    for decoding in ("greedy", "sampled"):
        for signal in ("lexical", "jaccard", "length", "flip_rate", "tf_kl"):
            assert (decoding, signal) in rows
    for r in rows.values():
        assert r["current"] == (r["signal"] in ("lexical", "dissimilarity", "entropy", "tf_kl"))
        assert r["oracle_delta"] >= 0.0 and r["null"] >= r["oracle_delta"]
        for label in ("int4", "int3"):
            mean, pairs = r.get(f"{label}_mean"), r.get(f"{label}_pairs")
            if mean is not None and mean <= r["null"]:
                assert pairs is None
    # int3 sits far above teacher-forced KL's null and is called within a handful of pairs.
    for decoding in ("greedy", "sampled"):
        kl = rows[(decoding, "tf_kl")]
        assert kl["int3_pairs"] is not None and kl["int3_pairs"] < 20
    assert "| corpus | greedy | lexical* |" in text and "| corpus | greedy | jaccard |" in text


def test_the_oracle_delta_leaves_at_most_alpha_of_the_draws_below_the_mean() -> None:
    bounds = [i / 64 for i in range(40)]  # binary fractions: the sums below are exact
    delta = signal_power.oracle_delta(bounds, traffic_mean=0.5, alpha=0.025)
    assert sum(b + delta < 0.5 for b in bounds) <= 0.025 * len(bounds)
    # The smallest such δ: one step less leaves more than alpha below.
    assert sum(b + delta - 1 / 64 < 0.5 for b in bounds) > 0.025 * len(bounds)
    # A calibration that already sits above the traffic needs no δ.
    assert signal_power.oracle_delta([0.5, 0.6], traffic_mean=0.3, alpha=0.025) == 0.0


def test_the_signed_entropy_signals_split_the_shift_by_its_direction() -> None:
    from quantdrift.breaker.policy import load_policy
    from quantdrift.schemas.score import Metrics

    rp = load_policy(None).for_route("eval/route")
    up, down = signal_power.OTHERS["entropy_up"], signal_power.OTHERS["entropy_down"]
    clip = rp.entropy_clip
    more = Metrics.model_construct(entropy_shift=clip / 2)
    assert up(more, rp) == 0.75 and down(more, rp) == 0.25
    # Beyond the clip either way saturates; no shift sits at the middle.
    assert up(Metrics.model_construct(entropy_shift=-3 * clip), rp) == 0.0
    assert down(Metrics.model_construct(entropy_shift=0.0), rp) == 0.5
    assert up(Metrics.model_construct(entropy_shift=None), rp) is None
