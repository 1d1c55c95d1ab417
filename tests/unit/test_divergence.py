"""The first divergent token (pure), and the worst pairs an alert carries: the slice's own
on a slice trip, each with its prompt reference and its first divergent token."""

from __future__ import annotations

import math

import pytest

from quantdrift.breaker.machine import judge
from quantdrift.breaker.policy import Policy, RoutePolicy
from quantdrift.breaker.state import RouteState, WorstPair
from quantdrift.detectors.divergence import FLOOR, divergent_token, first_divergence
from quantdrift.detectors.suite import score_event, score_pairs
from quantdrift.replay import build_report, rescore_stream
from quantdrift.replay.render import render_html
from quantdrift.schemas.pair import ModelOutput, PairEvent, RequestInfo
from quantdrift.schemas.score import Metrics, ScoreEvent


@pytest.mark.parametrize(
    ("forced", "ranks", "width", "want"),
    [
        ([-0.1, -0.2, -0.3], [1, 1, 1], 5, None),  # the reference's own choice throughout
        ([-0.1, -1.2, -0.3], [1, 2, 1], 5, None),  # its second choice, likely: sampling
        ([-0.1, -2.9, -0.3], [1, 2, 1], 5, 1),  # its second choice, under 10 %
        ([-0.1, -0.2, -2.0], [1, 1, 6], 5, 2),  # out of its top-5, though above the floor
        ([-3.5, -0.1], [1, 9], 5, 1),  # a flat top-1 is never a divergence
        ([-0.1, -2.0], [1, 2], 1, 1),  # top-1 only reported: rank 2 is out of it
    ],
)
def test_the_first_divergent_position_by_its_definition(
    forced: list[float], ranks: list[int], width: int, want: int | None
) -> None:
    top = [{f"t{j}": -0.01 * j for j in range(width)} for _ in forced]
    assert first_divergence(forced, ranks, top) == want


def test_without_ranks_only_the_floor_applies() -> None:
    assert pytest.approx(math.log(0.1)) == FLOOR
    assert first_divergence([-0.1, -2.0, -2.4], None, None) == 2
    assert first_divergence([-0.1, -2.0], None, None) is None


TOKENS = ["The", " capital", " is", " Lyon", ",", " in", " France"]


def forced_pair(*, private: bool = False, clear: bool = False, **changes: object) -> PairEvent:
    """A teacher-forced pair whose candidate leaves the reference at " Lyon" (position 3)."""
    forced = [-0.05, -0.1, -0.2, -6.5, -0.3, -0.2, -0.1]
    ranks = [1, 1, 1, 8, 1, 1, 1]
    top = [{t: lp} for t, lp in zip(TOKENS, forced, strict=True)]
    top[3] = {" Paris": -0.02, " the": -4.1}
    prompt = "user: What is the capital of France?"
    data: dict[str, object] = {
        "pair_id": "p1",
        "ts": 1.0,
        "route": "r",
        "candidate": ModelOutput(
            text="".join(TOKENS),
            tokens=TOKENS,
            token_logprobs=[-0.1, -0.1, -0.1, -0.4] + [-0.1] * 3,
        ),
        "reference": ModelOutput(text="The capital is Paris, in France"),
        "request": RequestInfo(
            prompt=prompt if clear else None,
            prompt_hash=None if clear else "ab" * 16,
            private=private,
            temperature=0.0,
        ),
        "reference_logprobs_on_candidate": forced,
        "reference_rank_on_candidate": ranks,
        "reference_top_on_candidate": top,
        "tags": {"language": "en"},
    }
    return PairEvent.model_validate({**data, **changes})


def test_a_forced_pair_names_its_known_divergence_point() -> None:
    found = divergent_token(forced_pair())
    assert found is not None
    assert (found.position, found.of, found.token, found.rank) == (3, 7, " Lyon", 8)
    assert (found.reference_logprob, found.candidate_logprob) == (-6.5, -0.4)
    assert list(found.preferred) == [" Paris", " the"] and found.context is None
    assert found.line() == (
        "token 3/7 ' Lyon': reference rank 8, log-prob -6.50; it preferred ' Paris' | ' the'"
    )


def test_what_an_alert_may_show_follows_the_routes_privacy() -> None:
    clear = divergent_token(forced_pair(clear=True))
    assert clear is not None and clear.context == "The capital is"  # the answer before it
    private = divergent_token(forced_pair(private=True))
    assert private is not None and private.position == 3 and private.rank == 8
    assert private.token is None and private.preferred == {} and private.context is None
    assert "(private)" in private.line()


def test_pairs_without_a_usable_forced_pass_have_none() -> None:
    assert divergent_token(forced_pair(reference_logprobs_on_candidate=None)) is None
    short = forced_pair(reference_logprobs_on_candidate=[-0.1], reference_rank_on_candidate=None,
                        reference_top_on_candidate=None)  # fmt: skip
    assert divergent_token(short) is None  # not the candidate's tokens: no position to name
    bare = divergent_token(forced_pair(reference_rank_on_candidate=None))
    assert bare is not None and bare.position == 3 and bare.rank is None  # by the floor
    assert list(bare.preferred) == [" Paris", " the"]  # what the reference reported there


def test_the_score_carries_the_prompt_reference_and_the_divergence() -> None:
    pair = forced_pair(clear=True)
    score = score_event(pair, score_pairs([pair], None)[0])
    again = ScoreEvent.parse(score.dumps())  # on the wire and back
    assert again.prompt_excerpt == "user: What is the capital of France?"
    assert again.prompt_hash is None
    assert again.divergence is not None and again.divergence.position == 3
    hashed = score_event(forced_pair(), Metrics())
    assert hashed.prompt_excerpt is None and hashed.prompt_hash == "ab" * 16


def test_a_pair_with_too_many_alternatives_a_position_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 20"):
        forced_pair(reference_top_on_candidate=[{f"t{i}": -1.0 for i in range(21)}] * 7)


# -- the worst pairs an alert carries ------------------------------------------------------


def shadow(
    i: int, language: str, reasons_metrics: Metrics, divergence_at: int | None = None
) -> ScoreEvent:
    pair = forced_pair(pair_id=f"{language}{i}", tags={"language": language})
    found = divergent_token(pair) if divergence_at is not None else None
    return ScoreEvent(
        pair_id=f"{language}{i}", route="r", kind="shadow", ts=float(i), decoding="greedy",
        metrics=reasons_metrics, tags={"language": language}, prompt_hash="cd" * 16,
        divergence=found,
    )  # fmt: skip


LOOP = Metrics(cosine=0.95, repetition_run=9, reference_repetition_run=1)  # a hard failure
HEALTHY = Metrics(cosine=0.99)
JSON_BROKEN = Metrics(cosine=0.3, json_ok=False, json_error="json: missing key 'a'")


def test_a_slice_trip_shows_its_own_worst_pairs_not_the_routes() -> None:
    policy = RoutePolicy(
        min_pairs=5, slice_dimensions=("language",), slice_min_pairs=5, rollback_scope="slice"
    )
    state = RouteState()
    # English: broken JSON and very dissimilar, so worse than any Chinese pair by the
    # route's ordering, but too rare to trip anything.
    # Then three healthy English pairs to one looping Chinese pair, as in the traffic
    # the end-to-end test sends: the Chinese slice trips before the route does.
    stream = [shadow(i, "en", JSON_BROKEN) for i in range(3)]
    for i in range(40):
        stream += [shadow(100 + 3 * i + j, "en", HEALTHY) for j in range(3)]
        stream.append(shadow(i, "zh", LOOP, divergence_at=3))
    opened = None
    for i, score in enumerate(stream):
        decision = judge(policy, state, score, now=float(i))
        state = decision.state
        if decision.transition is not None:
            opened = decision.transition
            break
    assert opened is not None and opened.slice == ("language", "zh"), opened
    worst = opened.evidence["worst_pairs"]
    assert len(worst) == policy.worst_pairs_kept
    assert all(w["tags"] == {"language": "zh"} for w in worst)
    assert all(w["first_divergent_token"]["position"] == 3 for w in worst)
    assert all(w["prompt_hash"] == "cd" * 16 for w in worst)


def test_a_route_trip_shows_the_routes_worst_and_the_state_reads_old_entries() -> None:
    policy = RoutePolicy(min_pairs=5)
    state = RouteState()
    opened = None
    for i in range(40):
        language = "en" if i % 2 else "zh"
        decision = judge(policy, state, shadow(i, language, LOOP), now=float(i))
        state = decision.state
        if decision.transition is not None:
            opened = decision.transition
            break
    assert opened is not None and opened.slice is None
    worst = opened.evidence["worst_pairs"]
    assert len(worst) == policy.worst_pairs_kept
    assert {w["tags"]["language"] for w in worst} == {"en", "zh"}
    old = RouteState.from_json(
        {"worst": [{"pair_id": "p", "similarity": 0.5, "reasons": ["x"]}]}
    )  # written before the worst pairs carried more
    assert old.worst == (WorstPair("p", 0.5, ("x",)),)
    assert RouteState.from_json(state.to_json()).worst == state.worst


def test_replay_lists_the_first_divergent_token_of_its_worst_pairs() -> None:
    pairs = [forced_pair(pair_id=f"p{i}", clear=True) for i in range(3)]
    scores = rescore_stream(pairs, None, Policy())
    report = build_report(scores, Policy(), worst_n=2)
    (rep,) = report.routes.values()
    assert [w["first_divergent_token"]["position"] for w in rep.worst] == [3, 3]  # type: ignore[index]
    assert rep.worst[0]["prompt"] == "user: What is the capital of France?"
    assert "token 3/7 &#x27; Lyon&#x27;: reference rank 8" in render_html(report)
