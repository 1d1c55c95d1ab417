"""Build and run one worker process from settings: the only place that wires I/O."""

from __future__ import annotations

import logging
import os

import faust

from quantdrift.breaker.policy import Policy, load_policy
from quantdrift.config import Settings
from quantdrift.detectors import Embedder
from quantdrift.embedding.factory import build_scorer
from quantdrift.failpoints import failpoints
from quantdrift.schemas.signing import signer_from_settings
from quantdrift.streams.agents import WorkerStats, attach_agents, redis_store_factory
from quantdrift.streams.app import Topics, create_app


def make_embedder(settings: Settings) -> Embedder | None:
    """The configured scorer (``embedding.tier``: tiered, minilm, static, none)."""
    return build_scorer(settings.embedding)


def build_worker_app(
    settings: Settings, redis_url: str, policy: Policy | None = None
) -> tuple[faust.App, Topics, WorkerStats]:
    policy = policy if policy is not None else load_policy(settings.policy_file)
    app, topics = create_app(settings)
    signer = signer_from_settings(settings.signing.active_key_id, settings.signing.keys)
    failpoint = failpoints(settings.worker.failpoints)
    stats = attach_agents(
        app,
        topics,
        policy=policy,
        store_factory=redis_store_factory(
            redis_url,
            signer,
            settings.redis.key_prefix,
            settings.worker.dedupe_ttl_s,
            failpoint,
        ),
        failpoint=failpoint,
        embedder_factory=lambda: make_embedder(settings),
        batch_max=settings.worker.batch_max,
        batch_within_s=settings.worker.batch_within_s,
        claim_ttl_ms=settings.worker.outbox_claim_ttl_ms,
    )
    return app, topics, stats


def run_worker(settings: Settings, redis_url: str, loglevel: str = "warning") -> None:
    """Run until SIGTERM/SIGINT; Faust owns the event loop and the signals."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(
        level=loglevel.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    app, _, _ = build_worker_app(settings, redis_url)
    # Load the embedder before joining the group, so the first batch is not a 5 s stall.
    worker = faust.Worker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
