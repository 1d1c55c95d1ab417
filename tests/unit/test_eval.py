"""Offline evaluation on synthetic streams with known answers."""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence

import numpy as np
import pytest

from quantdrift.breaker import Policy
from quantdrift.evaluation import ScoreCache, build_plan, evaluate, floor_seed, standard_policies
from quantdrift.evaluation.cache import to_score
from quantdrift.schemas import Metrics, ModelOutput, PairEvent, RequestInfo, ScoreEvent


class BagOfWords:
    """A deterministic stand-in for MiniLM: hashed word counts, L2-normalized."""

    tier = "bow"

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), 256), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, zlib.crc32(word.encode()) % 256] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


def pair(i: int, cand: str, ref: str, route: str = "r/int4", kind: str = "shadow") -> PairEvent:
    return PairEvent(
        pair_id=f"p{i}",
        ts=float(i),
        route=route,
        kind=kind,  # type: ignore[arg-type]
        candidate=ModelOutput(text=cand),
        reference=ModelOutput(text=ref),
        request=RequestInfo(temperature=0.0),
    )


SAME = "the refund is issued within thirty days of purchase"
OTHER = "purple elephants dance quietly under frozen moons tonight"


def ok(i: int) -> PairEvent:
    return pair(i, SAME, SAME)


def bad(i: int) -> PairEvent:
    return pair(i, OTHER, SAME)


def run(healthy, drifted=(), calibrate=(), **kw):  # type: ignore[no-untyped-def]
    plan = build_plan(healthy, drifted, calibrate, **kw)
    results = evaluate(plan, ScoreCache(BagOfWords()), standard_policies(Policy()))
    return plan, {r.policy: r for r in results}


def test_seeds_policy_by_hand_on_a_tiny_stream() -> None:
    # 25 healthy pairs, of which 21, 22, 23 (1-based) fail: three strikes after
    # min_pairs (20) -> one false rollback at healthy pair 23. The route is then
    # open (cool-down 60 pairs) when the drift starts: delay 0, "open at onset".
    healthy = [bad(i) if i in (20, 21, 22) else ok(i) for i in range(25)]
    drifted = [bad(100 + i) for i in range(5)]
    _, r = run(healthy, drifted)
    seeds = r["seeds"]
    assert (seeds.healthy_pairs, seeds.false_rollbacks, seeds.drifted_pairs) == (25, 1, 5)
    assert seeds.routes[0].first_false_rollback == "consecutive @ healthy pair 23"
    assert seeds.false_rollbacks_per_10k == 400.0
    assert (seeds.detection_delay_pairs, seeds.detected_by) == (0, "open at onset")
    assert seeds.routes[0].healthy_pairs_on_reference == 2


def test_seeds_delay_counts_drifted_pairs_up_to_the_tripping_one() -> None:
    # fail, fail, ok, fail, fail, fail: the 6th drifted pair is the third in a row.
    drifted = [bad(100), bad(101), ok(102), bad(103), bad(104), bad(105), bad(106)]
    _, r = run([ok(i) for i in range(30)], drifted)
    assert r["seeds"].false_rollbacks == 0
    assert (r["seeds"].detection_delay_pairs, r["seeds"].detected_by) == (6, "consecutive")


def test_never_detected_is_none() -> None:
    _, r = run([ok(i) for i in range(30)], [ok(100 + i) for i in range(10)])
    assert all(x.detection_delay_pairs is None and x.detected_by is None for x in r.values())


VOCAB = [f"w{i}" for i in range(300)]


def perturbed(rng: random.Random, words: list[str], k: int) -> str:
    out = list(words)
    for j in rng.sample(range(len(out)), k):
        out[j] = rng.choice(VOCAB)
    return " ".join(out)


def synthetic_pairs(seed: int = 5) -> tuple[list[PairEvent], list[PairEvent]]:
    """Healthy: one word of 12 changed (cosine ~0.92); noise pairs (every 3rd): 1-2 words;
    drifted: unrelated text. Known answer: no false rollback, drift caught at once."""
    rng = random.Random(seed)
    healthy: list[PairEvent] = []
    for i in range(225):
        ref = [rng.choice(VOCAB) for _ in range(12)]
        healthy.append(pair(i, perturbed(rng, ref, 1), " ".join(ref)))
        if i % 3 == 0:
            other = perturbed(rng, ref, rng.choice((1, 2)))
            healthy.append(pair(1000 + i, other, " ".join(ref), kind="noise"))
    drifted = []
    for i in range(40):
        ref = [rng.choice(VOCAB) for _ in range(12)]
        drifted.append(
            pair(5000 + i, " ".join(rng.choice(VOCAB) for _ in range(12)), " ".join(ref))
        )
    return healthy, drifted


def test_healthy_only_gives_no_false_rollback_under_the_default_policy() -> None:
    healthy, _ = synthetic_pairs()
    _, r = run(healthy)
    assert r["default"].false_rollbacks == 0 and r["default"].healthy_pairs == 225
    assert r["seeds"].false_rollbacks == 0
    assert r["default"].drifted_pairs == 0 and r["default"].detection_delay_pairs is None


def test_drift_is_caught_within_20_pairs_by_every_rule_family() -> None:
    healthy, drifted = synthetic_pairs()
    _, r = run(healthy, drifted)
    assert set(r) == {"default", "seeds", "windowed", "sequential"}
    for name in ("default", "sequential", "seeds"):
        assert r[name].false_rollbacks == 0
        assert r[name].detection_delay_pairs is not None
        assert 1 <= r[name].detection_delay_pairs <= 20, name
    assert r["sequential"].detected_by == "sequential"
    assert r["default"].detected_by == "tolerance:dissimilarity"


def test_one_scoring_pass_serves_every_policy() -> None:
    healthy, drifted = synthetic_pairs()
    plan = build_plan(healthy, drifted, repeat=3)
    embedder = BagOfWords()
    cache = ScoreCache(embedder, batch_size=64)
    evaluate(plan, cache, standard_policies(Policy()))
    assert cache.scored == len(healthy) + len(drifted)
    assert embedder.calls == -(-(len(healthy) + len(drifted)) // 64)


def test_drifted_routes_are_rerouted_onto_the_single_healthy_route() -> None:
    noise = pair(50, SAME, SAME + " indeed", route="lab/noise", kind="noise")
    plan = build_plan([ok(0), noise, ok(1)], [pair(9, OTHER, SAME, route="lab/int2")])
    (stream,) = plan.streams
    assert stream.route == "r/int4" and (stream.healthy_pairs, stream.drifted_pairs) == (2, 1)
    assert [s.kind for s in stream.steps] == ["shadow", "noise", "shadow", "shadow"]
    assert any("re-routed onto r/int4" in n for n in plan.notes)


def test_several_healthy_routes_keep_their_own_drift() -> None:
    healthy = [pair(0, SAME, SAME, "a"), pair(1, SAME, SAME, "b")]
    drifted = [pair(2, OTHER, SAME, "b"), pair(3, OTHER, SAME, "c")]
    noise = [pair(4, SAME, OTHER, "n", "noise")]
    plan = build_plan(healthy + noise, drifted)
    counts = {s.route: (s.healthy_pairs, s.drifted_pairs) for s in plan.streams}
    assert counts == {"a": (1, 0), "b": (1, 1), "c": (0, 1)}
    # Noise on a route that is not a stream feeds every stream known at that point.
    assert [s.kind for s in plan.streams[0].steps] == ["shadow", "noise"]


def test_noise_as_shadow_splits_the_noise_pairs() -> None:
    noise = [pair(i, f"{SAME} {i}", SAME, route="lab/noise", kind="noise") for i in range(6)]
    plan = build_plan(noise, noise_as_shadow=True)
    (stream,) = plan.streams
    assert stream.route == "lab/noise" and stream.healthy_pairs == 3
    assert [s.pair.pair_id for s in stream.steps if s.kind == "shadow"] == ["p1", "p3", "p5"]


def test_repeat_replays_the_healthy_shadow_pairs_with_fresh_ids() -> None:
    noise = pair(50, SAME, OTHER, kind="noise")
    plan = build_plan([ok(0), noise], repeat=3)
    (stream,) = plan.streams
    assert stream.healthy_pairs == 3 and sum(s.kind == "noise" for s in stream.steps) == 1
    assert len({s.pair_id for s in stream.steps}) == 4
    with pytest.raises(ValueError):
        build_plan([ok(0)], repeat=0)


def noise_score(i: int, mode: str, identical: bool) -> ScoreEvent:
    m = Metrics(
        rougeL=1.0 if identical else 0.5,
        first_divergence=None if identical else 2,
        candidate_tokens=5,
        reference_tokens=5,
    )
    return ScoreEvent(pair_id=str(i), route="r", kind="noise", ts=0, decoding=mode, metrics=m)


def test_greedy_floor_is_never_built_from_sampled_pairs() -> None:
    scores = [noise_score(i, "greedy", True) for i in range(40)]
    scores += [noise_score(100 + i, "sampled", False) for i in range(40)]
    seed, source = floor_seed(scores, min_pairs=30)
    # Identical greedy runs say nothing; sampled runs must not stand in for them.
    assert seed["greedy"] == [] and len(seed["sampled"]) == 40
    assert source["greedy"] == "no informative greedy noise pairs"
    # A blessed baseline fills the greedy floor under its own keys.
    blessed = [
        noise_score(200 + i, "greedy", False).model_copy(update={"kind": "shadow"})
        for i in range(12)
    ]
    seed, source = floor_seed(scores, min_pairs=30, blessed=blessed)
    # ... and each blessed pair's paired outcome (concordant here: 1/2) and its hard
    # failure (none here) under their keys.
    assert len(seed["greedy"]) == 12
    assert seed["greedy"][0] == {
        "blessed:rougeL": 0.5,
        "blessed:outcomes": 0.5,
        "blessed:hard": 0.0,
    }
    assert source["greedy"] == "no informative greedy noise pairs; 12 blessed pairs"


def test_to_score_applies_the_route_policy_thresholds() -> None:
    p = bad(1)
    m = Metrics(cosine=0.86, rougeL=0.2)
    strict = Policy().default
    loose = strict.model_copy(update={"similarity_threshold": 0.8})
    assert to_score(p, m, strict).verdict == "drift"
    assert to_score(p, m, loose, route="x").verdict == "ok"
    assert to_score(p, m, loose, route="x").route == "x"
