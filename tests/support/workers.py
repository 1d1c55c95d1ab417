"""The one place a test builds a ``quantdrift worker`` child (``WorkerProcess``).

Tests call :func:`start_worker` (or the ``worker_process`` fixture, which also
stops what it started); the fault tests' :class:`~support.transitions.FailpointWorker`
is the same child with crash points armed and no embedder.
"""

from __future__ import annotations

from quantdrift.config import Settings
from quantdrift.demo.workers import WorkerProcess


def start_worker(
    settings: Settings,
    redis_url: str | None = None,
    *,
    web_port: int | None = None,
    log_level: str = "warning",
) -> WorkerProcess:
    """A started worker on ``settings`` (``redis_url``: theirs unless given); ``web_port``
    serves its status page there (0, the tests' default, serves none)."""
    if web_port is not None:
        worker = settings.worker.model_copy(update={"web_port": web_port})
        settings = settings.model_copy(update={"worker": worker})
    url = redis_url if redis_url is not None else settings.redis.url
    if url is None:
        raise ValueError("no Redis URL: pass redis_url or set settings.redis.url")
    return WorkerProcess(settings, url, log_level=log_level).start()
