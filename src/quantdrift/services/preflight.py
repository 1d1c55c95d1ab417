"""Preflight's context as the command line builds it: the console and the scorer handed in.

Preflight runs two parts it does not own: the switch drill runs the breaker's console
exactly as ``quantdrift route`` does, and the shadow link times the worker's own scorer.
Both are composed here, above preflight, so preflight imports neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from quantdrift.config import EmbeddingSettings, Settings
from quantdrift.embedding import factory
from quantdrift.preflight.config import PreflightConfig
from quantdrift.preflight.context import Context
from quantdrift.schemas import Metrics, PairEvent
from quantdrift.services import console


def pair_scorer(settings: EmbeddingSettings) -> Callable[[Sequence[PairEvent]], list[Metrics]]:
    """The worker's scorer for ``settings``, built once: pairs in, their metrics out."""
    # Through the module, so the factory stays one seam (tests count what it builds).
    scorer = factory.build_scorer(settings)
    return lambda pairs: factory.score_with(scorer, pairs)


def preflight_context(
    config: PreflightConfig,
    settings: Settings | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> Context:
    """A context whose checks run the real console and the worker's scorer."""
    return Context(
        config, settings=settings, progress=progress, console=console, scorer=pair_scorer
    )
