"""Where the demo's pairs come from: the slice of the traffic corpus the package ships
(recorded on vLLM: many tasks, four languages, three input lengths), a pairs file the
user names, or generated pairs."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from quantdrift.demo import synthetic as generated
from quantdrift.errors import ConfigError
from quantdrift.evaluation.modes import select
from quantdrift.schemas import PairEvent
from quantdrift.services.pairs import CORPUS_SLICE, read_pairs

ROUTE = "cs-agent/int4"
HEALTHY = ("int8", "noise")
# The corpus's group-wise int3, and the lab's int3 / int2 in a lab pairs file.
BROKEN = ("int3-g64", "int3", "int2")


def _cycle_as(pairs: list[PairEvent], label: str) -> Iterator[PairEvent]:
    """Replay pairs on the demo route, with fresh ids on each pass so dedupe keeps them."""
    for n, pair in enumerate(itertools.cycle(pairs)):
        yield pair.model_copy(update={"route": ROUTE, "pair_id": f"{label}-{n:05d}-{pair.pair_id}"})


def demo_streams(
    path: Path | None, *, synthetic: bool = False
) -> tuple[Iterator[PairEvent], Iterator[PairEvent], str, list[PairEvent]]:
    """(healthy, drifted, description, calibration).

    Recorded pairs: the route is calibrated as an operator would (``quantdrift
    calibrate --blessed-label int8``) on the calibration part of the prompts: noise
    pairs and the blessed int8 run; the demo then streams the evaluation part, healthy
    = int8 + noise, drifted = int3 (the corpus's ``int3-g64``, or a lab file's int3 /
    int2). Generated pairs come with no calibration.
    """
    if not synthetic:
        try:
            pairs = read_pairs(path, shipped=CORPUS_SLICE)
        except (FileNotFoundError, ModuleNotFoundError):
            if path is not None:
                raise ConfigError(f"pairs file not found: {path}") from None
            pairs = []
        shown = select(pairs, part="evaluation") or pairs
        calibration = select(pairs, part="calibration", labels=HEALTHY)
        healthy = [p for p in shown if p.label in HEALTHY]
        broken = [p for p in shown if p.label in BROKEN]
        if healthy and broken:
            what = "recorded pairs" if path is not None else "the shipped traffic-corpus slice"
            return (
                _cycle_as(healthy, "healthy"),
                _cycle_as(broken, "drifted"),
                what,
                calibration,
            )
        if path is not None:
            raise ConfigError(f"{path}: needs pairs labelled int8/noise and int3(-g64)/int2")
    return generated.healthy(ROUTE), generated.drifted(ROUTE), "generated pairs", []
