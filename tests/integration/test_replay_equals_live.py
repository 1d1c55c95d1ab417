"""Replay reproduces a live run: same scorer, same policy, same transitions at the same pairs.

A real worker (``quantdrift worker``, its default tiered scorer) judges a stream on
the embedded broker and publishes a signed rollback. Then ``quantdrift replay``
reads that run's pairs topic with the worker's settings and no ``--embedder``, and
must find the same transitions at the same decisive pairs, and the same per-pair
verdicts as the scores the worker published.
"""

from __future__ import annotations

import asyncio
import csv
import json
import uuid
from pathlib import Path

import pytest

from quantdrift.cli import main
from quantdrift.demo import synthetic
from quantdrift.demo.workers import settings_env
from quantdrift.schemas import unverified_score
from quantdrift.schemas.signing import unverified_command
from support.guard import (
    isolated_settings,
    make_topics,
    on_route,
    records_for,
    send_pairs,
    shadow_only,
    until_seen,
    wait_scored,
)
from support.redis_keys import forget_prefix
from support.workers import start_worker

# The worker loads MiniLM for its tiered scorer, and so does the replay.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ROUTE = "replay-live/int4"
# The seeds' rule and the sequential test; a cool-down longer than the run, so the
# live wall clock and replay's pair timestamps cannot disagree about a half-open.
POLICY = "default:\n  rules: [consecutive, sequential]\n  cooldown_s: 3600\n"


def test_replay_of_a_live_run_gives_its_transitions_at_its_pairs(
    stack, tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    prefix = f"qdreplaylive:{uuid.uuid4().hex}:"
    settings = isolated_settings(stack, prefix, partitions=1).model_copy(
        update={"policy_file": policy}
    )
    topics, bootstrap = settings.kafka.topics, settings.kafka.bootstrap_servers
    tag = uuid.uuid4().hex[:6]
    pairs = on_route(
        shadow_only(synthetic.healthy(ROUTE, seed=3), 40)
        + shadow_only(synthetic.drifted(ROUTE, seed=5), 12),
        ROUTE,
        tag,
    )
    asyncio.run(make_topics(settings))
    monkeypatch.delenv("QUANTDRIFT_EMBEDDING__TIER", raising=False)  # the default tier
    worker = start_worker(settings, stack.redis_url)
    try:
        asyncio.run(wait_scored(settings, worker))
        asyncio.run(
            send_pairs(bootstrap, topics.pairs, [(ROUTE.encode(), p.dumps()) for p in pairs])
        )
        asyncio.run(until_seen(settings, ROUTE, len(pairs), worker, timeout=180.0))
        control = asyncio.run(records_for(bootstrap, topics.control, ROUTE, timeout=5.0))
        published = asyncio.run(records_for(bootstrap, topics.scores, ROUTE, timeout=5.0))
    finally:
        worker.stop()
        forget_prefix(stack.redis_url, prefix)

    commands = [unverified_command(r.value) for r in control]
    live = [(c.evidence["decisive_pair_id"], c.evidence["rule"], c.action) for c in commands]
    assert live, "the live run must roll the route back, or there is nothing to reproduce"
    live_verdicts = {
        s.pair_id: s.verdict for s in map(unverified_score, (r.value for r in published))
    }
    assert set(live_verdicts) == {p.pair_id for p in pairs}

    # The replay: the worker's settings from the environment, no --embedder.
    for name, value in settings_env(settings, stack.redis_url).items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "out"
    code = main(["replay", "--topic", "--json", "--no-progress", "--no-parquet", "--out", str(out)])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    trips = summary["routes"][ROUTE]["trips"]
    replayed = [
        (t["pair_id"], t["rule"], "rollback" if t["to"] == "open" else t["to"]) for t in trips
    ]
    assert replayed == live

    with (out / "scores.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["route"] == ROUTE]
    assert {r["pair_id"]: r["verdict"] for r in rows} == live_verdicts
    # Both sides scored with the worker's default, the tiered scorer (each live cosine
    # names its tier), not a fixed model.
    assert summary["scorer"] == "tiered"
    live_tiers = {unverified_score(r.value).metrics.cosine_tier for r in published}
    assert live_tiers <= {"static", "minilm"} and "static" in live_tiers
