"""DegenerationProbe: loops and entropy collapse, fed as a stream."""

from __future__ import annotations

import math

import pytest

from quantdrift.gateway.degeneration import (
    ENTROPY_COLLAPSE,
    LOOP,
    DegenerationConfig,
    DegenerationProbe,
    check_text,
)

SPREAD = {"a": math.log(0.4), "b": math.log(0.3), "c": math.log(0.2), "d": math.log(0.1)}
CERTAIN = {"a": 0.0, "b": -30.0, "c": -30.0}


def feed(probe: DegenerationProbe, pieces, tops=None) -> int | None:
    """Index of the piece at which the probe fired, or None."""
    for i, piece in enumerate(pieces):
        if probe.update(piece, [tops] if tops else None):
            return i
    return None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Answer: 42. " + "I am sorry. " * 12, LOOP),
        ("no " * 40, LOOP),
        ("The capital of France is Paris. It has many museums and a river.", None),
        ("1. apples\n2. pears\n3. plums\n4. figs\n5. dates\n6. limes\n", None),
        ("短" * 3, None),
    ],
)
def test_check_text(text: str, reason: str | None) -> None:
    assert check_text(text)[0] == reason


def test_a_loop_is_caught_while_streaming_not_at_the_end() -> None:
    probe = DegenerationProbe()
    pieces = [f"w{i} " for i in range(20)] + ["I ", "am ", "sorry. "] * 100
    at = feed(probe, pieces)
    assert at is not None and at < 60
    assert probe.reason == LOOP and probe.tripped
    assert probe.update("more") == LOOP  # sticky


def test_entropy_collapse_needs_a_full_window_below_the_floor() -> None:
    cfg = DegenerationConfig(entropy_window=16, repetition=False)
    probe = DegenerationProbe(cfg)
    assert feed(probe, [f"t{i} " for i in range(15)], CERTAIN) is None
    assert probe.update("t15 ", [CERTAIN]) == ENTROPY_COLLAPSE
    healthy = DegenerationProbe(cfg)
    assert feed(healthy, [f"t{i} " for i in range(200)], SPREAD) is None
    no_logprobs = DegenerationProbe(cfg)
    assert feed(no_logprobs, [f"t{i} " for i in range(200)]) is None


def test_one_confident_stretch_in_a_healthy_answer_is_not_a_collapse() -> None:
    probe = DegenerationProbe(DegenerationConfig(entropy_window=16, repetition=False))
    pieces = [(f"t{i} ", CERTAIN if i % 4 == 0 else SPREAD) for i in range(200)]
    assert all(probe.update(p, [t]) is None for p, t in pieces)


def test_disabled() -> None:
    probe = DegenerationProbe(DegenerationConfig(enabled=False))
    assert feed(probe, ["no "] * 100, CERTAIN) is None and probe.finish() is None
