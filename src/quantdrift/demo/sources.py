"""Where the demo's pairs come from: recorded lab pairs if shipped, else generated ones."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from quantdrift.demo import synthetic as generated
from quantdrift.errors import ConfigError
from quantdrift.evaluation.modes import select
from quantdrift.schemas import PairEvent
from quantdrift.services.pairs import read_pairs

ROUTE = "cs-agent/int4"


def _cycle_as(pairs: list[PairEvent], label: str) -> Iterator[PairEvent]:
    """Replay pairs on the demo route, with fresh ids on each pass so dedupe keeps them."""
    for n, pair in enumerate(itertools.cycle(pairs)):
        yield pair.model_copy(update={"route": ROUTE, "pair_id": f"{label}-{n:05d}-{pair.pair_id}"})


def demo_streams(
    path: Path | None, *, synthetic: bool = False
) -> tuple[Iterator[PairEvent], Iterator[PairEvent], str, list[PairEvent]]:
    """(healthy, drifted, description, calibration).

    Lab pairs: the route is calibrated as an operator would (``quantdrift calibrate
    --blessed-label int8``) on the calibration part of the prompts: noise pairs and
    the blessed int8 run; the demo then streams the evaluation part, healthy = int8 +
    noise, drifted = int2/int3. Generated pairs come with no calibration.
    """
    if not synthetic:
        try:
            pairs = read_pairs(path)
        except (FileNotFoundError, ModuleNotFoundError):
            if path is not None:
                raise ConfigError(f"pairs file not found: {path}") from None
            pairs = []
        shown = select(pairs, part="evaluation") or pairs
        calibration = select(pairs, part="calibration", labels=("int8", "noise"))
        healthy = [p for p in shown if p.label in ("int8", "noise")]
        broken = [p for p in shown if p.label in ("int2", "int3")]
        if healthy and broken:
            return (
                _cycle_as(healthy, "healthy"),
                _cycle_as(broken, "drifted"),
                "recorded lab pairs",
                calibration,
            )
        if path is not None:
            raise ConfigError(f"{path}: needs pairs labelled int8/noise and int2/int3")
    return generated.healthy(ROUTE), generated.drifted(ROUTE), "generated pairs", []
