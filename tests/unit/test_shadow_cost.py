"""The shadow cost estimate: spend by hand, delays against the breaker's own fold, the CLI.

The spend rows are worked by hand from the module's stated model. The delay estimate
is analytic (``BettingSR.expected_delay``); it is held against what the decision core
measures: seeded synthetic streams folded through ``StreamFold`` on the in-memory
store (``bench/shadow_cost.py``), the path eval and replay take.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import shadow_cost as bench  # bench/shadow_cost.py

from quantdrift.breaker.policy import Policy, RoutePolicy
from quantdrift.evaluation.shadow_cost import (
    Drift,
    ReferenceSpeed,
    Traffic,
    catch,
    detection,
    estimate,
    parse_drift,
    share_within,
    spend,
)


@pytest.mark.parametrize(
    ("traffic", "speed", "share", "noise", "forced", "prompt", "completion", "busy", "per_h"),
    [
        # runs = 0.1 + 0.02 x 1.9 = 0.138; forced passes 0.1 over 600 tokens, 1 generated
        (Traffic(10, 500, 100), ReferenceSpeed(5000, 100), 0.1, 0.02, True,
         1290.0, 139.0, 1.648, (3600.0, 720.0)),
        (Traffic(2, 0, 50), ReferenceSpeed(1000, 50), 0.5, 0.0, False,
         0.0, 50.0, 1.0, (3600.0, 0.0)),
        # noise on every request, shadow on all: 1 + 1 x 1 = 2 runs
        (Traffic(1, 100, 10), ReferenceSpeed(100, 10), 1.0, 1.0, False,
         200.0, 20.0, 4.0, (3600.0, 3600.0)),
    ],
)  # fmt: skip
def test_spend_by_hand(
    traffic: Traffic,
    speed: ReferenceSpeed,
    share: float,
    noise: float,
    forced: bool,
    prompt: float,
    completion: float,
    busy: float,
    per_h: tuple[float, float],
) -> None:
    s = spend(traffic, speed, share, noise, forced)
    assert s.reference_prompt_tokens_per_s == pytest.approx(prompt)
    assert s.reference_completion_tokens_per_s == pytest.approx(completion)
    assert s.replica_share == pytest.approx(busy)
    assert (s.shadow_pairs_per_hour, s.noise_pairs_per_hour) == pytest.approx(per_h)


def _growth_by_hand(p: float, m: float) -> float:
    return max(
        p * math.log(1 + f / m * (1 - m)) + (1 - p) * math.log(1 - f)
        for f in (0.05, 0.15, 0.35, 0.65, 0.95)
    )


@pytest.mark.parametrize(
    ("drift", "policy", "expect"),
    [
        (Drift("hard", 0.01), RoutePolicy(), None),  # under the tolerated 2 %
        (Drift("hard", 0.02), RoutePolicy(), None),  # at it
        (Drift("outcomes", 0.05), RoutePolicy(), None),  # at δ
        (Drift("hard", 1.0), RoutePolicy(), 20.0),  # min_pairs holds the alarm back
        (Drift("hard", 1.0), RoutePolicy(min_pairs=50), 50.0),
    ],
)
def test_detection_edges(drift: Drift, policy: RoutePolicy, expect: float | None) -> None:
    assert detection(policy, drift).pairs == expect


def test_detection_uses_the_route_budget_and_the_detectors_growth() -> None:
    policy = RoutePolicy()
    found = detection(policy, Drift("hard", 0.1))
    assert found.arl == 8e6  # 1e6 / (0.3 / 1.2 share x 0.5 aggregate)
    assert found.growth == pytest.approx(_growth_by_hand(0.1, 0.02))
    # A smaller budget is a lower threshold: fewer pairs, by log(8e6) - log(8e4) over g.
    cheaper = detection(RoutePolicy(false_alarm_budget_pairs=1e4), Drift("hard", 0.1))
    assert cheaper.arl == 8e4
    assert found.pairs - cheaper.pairs == pytest.approx(math.log(100) / found.growth)
    # A route without slices gives the aggregate the whole budget: half the arl.
    whole = detection(RoutePolicy(slice_dimensions=()), Drift("hard", 0.1))
    assert whole.arl == 4e6 and whole.pairs < found.pairs


def test_wall_clock_and_share_needed() -> None:
    traffic = Traffic(requests_per_s=4, prompt_tokens=300, completion_tokens=100)
    found = detection(RoutePolicy(), Drift("hard", 0.3))
    est = estimate(RoutePolicy(), traffic, ReferenceSpeed(1000, 100), [0.05, 0.5],
                   [Drift("hard", 0.3)])  # fmt: skip
    (low, (at_low,)), (_, (at_high,)) = est.rows
    assert at_low.seconds == pytest.approx(found.pairs / (4 * 0.05))
    assert at_high.seconds == pytest.approx(at_low.seconds / 10)
    assert catch(found, low, traffic) == at_low
    need = share_within(found, traffic, at_low.seconds)
    assert need == pytest.approx(0.05)
    assert share_within(found, traffic, 1.0) is None  # more than all the traffic


@pytest.mark.parametrize("text", ["hard", "hard=x", "loops=0.1", "hard=0", "hard=1.5"])
def test_bad_drifts_say_why(text: str) -> None:
    with pytest.raises(ValueError, match="drift"):
        parse_drift(text)


@pytest.mark.slow  # ~6,000 pairs through the fold, ~5 s
def test_estimate_is_within_a_fifth_of_the_breakers_measured_mean_delay() -> None:
    # The estimate is an approximation (Wald's identity with overshoot and the SR head
    # start), measured by bench/shadow_cost.py at 60 streams to sit within 15 % of the
    # fold's mean delay; at 40 streams the mean's own error is ~5-8 %.
    drifts = (Drift("hard", 0.1), Drift("hard", 0.3), Drift("outcomes", 0.3))
    rows = bench.run(Policy(), streams=40, seed=3, drifts=drifts)
    for row in rows:
        assert row["missed"] == 0, row
        assert row["mean"] * 0.8 <= row["estimate"] <= row["mean"] * 1.2, row


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quantdrift", "shadow", "cost", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


BASE = ("--rate", "20", "--prompt-tokens", "600", "--completion-tokens", "200",
        "--reference-prompt-tps", "4000", "--reference-completion-tps", "400")  # fmt: skip


def test_cli_json_takes_the_routes_share_from_the_gateway_config() -> None:
    done = _cli(*BASE, "--config", "examples/gateway.yaml", "--route", "cs-agent/int4",
                "--drift", "hard=0.3", "--within", "10m", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    (row,) = out["shares"]
    # examples/gateway.yaml: shadow 5 %, noise 1 %, not teacher-forced.
    assert (row["share"], row["noise_share"], row["teacher_forced"]) == (0.05, 0.01, False)
    runs = 0.05 + 0.01 * 1.95
    assert row["reference_prompt_tokens_per_s"] == pytest.approx(20 * runs * 600, abs=1e-3)
    assert row["reference_completion_tokens_per_s"] == pytest.approx(20 * runs * 200, abs=1e-3)
    assert row["replica_share"] == pytest.approx(20 * runs * (600 / 4000 + 200 / 400), abs=1e-4)
    assert row["shadow_pairs_per_hour"] == 3600.0
    (det,) = out["detections"]
    assert det["pairs"] == pytest.approx(detection(RoutePolicy(), Drift("hard", 0.3)).pairs, 0.01)
    assert row["catch"][0]["seconds"] == pytest.approx(det["pairs"] / (20 * 0.05), abs=0.2)
    assert out["within"]["share_needed"]["hard=0.3"] == pytest.approx(
        det["pairs"] / (20 * 600), abs=1e-4
    )


def test_cli_text_lists_each_share() -> None:
    done = _cli(*BASE, "--share", "0.01", "--share", "0.1", "--drift", "hard=0.01")
    assert done.returncode == 0, done.stderr
    assert "share 1.00%" in done.stdout and "share 10.00%" in done.stdout
    assert "hard=0.01: never (within the tolerance)" in done.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--share", "0"), "share must be in (0, 1]"),
        (("--drift", "loops=0.1"), "drift signal must be one of hard, outcomes"),
        (("--within", "soon"), "--within 'soon'"),
        (("--config", "examples/gateway.yaml", "--route", "nope"), "unknown route 'nope'"),
        (("--rate", "nan"), "requests_per_s must be a finite number"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(extra: tuple[str, ...], message: str) -> None:
    done = _cli(*BASE, *extra)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantdrift: error:"), done.stderr
    assert message in lines[0]


def test_cli_says_when_the_routes_policy_does_not_run_the_test(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("routes:\n  r/int4: {rules: [consecutive]}\n")
    done = _cli(*BASE, "--policy", str(policy), "--route", "r/int4",
                "--drift", "hard=0.5", "--drift", "outcomes=0.01", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    hard, outcomes = json.loads(done.stdout)["detections"]
    assert (hard["pairs"], hard["arl"], hard["never"]) == (
        None, None, "the policy does not run this test"
    )  # fmt: skip
    assert outcomes["pairs"] is None and outcomes["never"] == "the policy does not run this test"
    default = _cli(*BASE, "--drift", "outcomes=0.01", "--json")
    (det,) = json.loads(default.stdout)["detections"]
    assert det["never"] == "within the tolerance" and det["arl"] == pytest.approx(1.2e7)


def test_extra_candidates_add_only_their_forced_passes() -> None:
    t, speed = Traffic(10, 500, 100), ReferenceSpeed(5000, 100)
    one = spend(t, speed, 0.1, 0.0, True)
    three = spend(t, speed, 0.1, 0.0, True, candidates=3)
    # Two more forced passes per shadow pair: 2 x 0.1 x 10 req/s x 600 tokens in, 1 out.
    assert three.reference_prompt_tokens_per_s - one.reference_prompt_tokens_per_s == (
        pytest.approx(1200.0)
    )
    assert three.reference_completion_tokens_per_s - one.reference_completion_tokens_per_s == (
        pytest.approx(2.0)
    )
    # Without teacher forcing the reference pays the same for any number of builds.
    untaught = spend(t, speed, 0.1, 0.0, False, 3)
    assert untaught.reference_tokens_per_s == spend(t, speed, 0.1).reference_tokens_per_s


def test_cli_reads_the_routes_extra_candidates(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "precisions: {int4: [http://a], int8: [http://b], bf16: [http://c]}\n"
        "routes: {r/int4: {candidate: int4, reference: bf16, teacher_forced: true,"
        " extra_candidates: [int8]}}\n"
        "shadow_sample_rate: 0.1\n"
    )
    done = _cli(*BASE, "--config", str(config), "--route", "r/int4", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["shares"]
    assert (row["candidates"], row["teacher_forced"], row["share"]) == (2, True, 0.1)
    # 20 req/s x 0.1: one reference run (600 in) and two forced passes (800 in) each.
    assert row["reference_prompt_tokens_per_s"] == pytest.approx(2 * (600 + 2 * 800))
