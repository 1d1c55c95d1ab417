"""DegenerationProbe: loops and entropy collapse, fed as a stream."""

from __future__ import annotations

import json
import math

import pytest

from quantdrift.gateway.guards.degeneration import (
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


# -- structured output: a corpus of real-looking answers that must never trip ------------------

IDENTITY = [[int(i == j) for j in range(12)] for i in range(12)]
BOARD = "board = [\n" + "    [0, 0, 0, 0, 0, 0, 0, 0],\n" * 8 + "]\n"
KERAS = (
    "```python\nmodel = Sequential()\n"
    + 'model.add(Dense(64, activation="relu"))\n' * 6
    + 'model.add(Dense(10, activation="softmax"))\nmodel.compile(optimizer="adam")\n```\n'
)
TABLE = (
    "| Day | Opens | Closes | Notes |\n|---|---|---|---|\n"
    + "| Mon | 09:00 | 17:00 | - |\n| Tue | 09:00 | 17:00 | - |\n| Wed | 09:00 | 17:00 | - |\n"
    + "| Thu | 09:00 | 17:00 | - |\n| Fri | 09:00 | 17:00 | - |\n"
    + "| - | - | - | - |\n" * 4
)
ZERO_TABLE = "| x | y | z |\n|---|---|---|\n" + "| 0 | 0 | 0 |\n" * 20
HTML = "```html\n<table>\n" + "  <tr><td>0</td><td>0</td><td>0</td></tr>\n" * 12 + "</table>\n```"
CSV = "id,status,retries\n" + "".join(f"{i},ok,0\n" for i in range(40))
STRUCTURED_CORPUS = {
    "json zeros": json.dumps({"values": [0] * 300}),
    "json identity matrix": json.dumps({"matrix": IDENTITY}),
    "json same objects": json.dumps({"checks": [{"ok": True, "retries": 0}] * 12}),
    "json nested nulls": json.dumps({"rows": [[None, None, None]] * 15, "total": 0}),
    "json padded": json.dumps({"flags": [False] * 64, "mask": "0" * 64}, indent=2),
    "python board": "```python\n" + BOARD + "```",
    "python identity": "```python\nI = " + repr(IDENTITY) + "\n```",
    "keras lines": KERAS,
    "markdown table": TABLE,
    "zero table": ZERO_TABLE,
    "html table": HTML,
    "csv": CSV,
    "sql inserts": "```sql\n"
    + "".join(f"INSERT INTO t (id, v) VALUES ({i}, 0);\n" for i in range(30))
    + "```",
    "yaml list": "```yaml\nreplicas:\n" + "  - {cpu: 1, memory: 1Gi}\n" * 10 + "```",
    "numbered steps": "".join(f"{i}. Stir the mixture.\n" for i in range(1, 7)),
    "asm nops": "```asm\n" + "    nop\n" * 12 + "    ret\n```",
}


def _stream(text: str, probe: DegenerationProbe) -> str | None:
    for i in range(0, len(text), 4):
        if probe.update(text[i : i + 4]):
            return probe.reason
    return probe.finish()


@pytest.mark.parametrize("name", list(STRUCTURED_CORPUS))
@pytest.mark.parametrize("json_request", [False, True], ids=["free", "json"])
def test_structured_output_never_trips(name: str, json_request: bool) -> None:
    text = STRUCTURED_CORPUS[name]
    probe = DegenerationProbe(DegenerationConfig(check_every=1), structured=json_request)
    assert _stream(text, probe) is None, f"{name}: {probe.detail}"
    assert check_text(text, structured=json_request)[0] is None


def test_the_corpus_shows_zero_trips() -> None:
    trips = [
        name
        for name, text in STRUCTURED_CORPUS.items()
        for structured in (False, True)
        if _stream(text, DegenerationProbe(DegenerationConfig(check_every=1), structured))
    ]
    print(f"\nstructured corpus: {len(STRUCTURED_CORPUS) * 2} streams, {len(trips)} trips")
    assert trips == []


@pytest.mark.parametrize(
    "text",
    [
        '{"answer": "' + "I am sorry. " * 80,  # a JSON answer that fell into a loop
        "```python\n" + 'print("retry")\n' * 60,  # a runaway code loop
        "| a | b |\n|---|---|\n" + "| yes | no |\n" * 60,  # a runaway table
    ],
    ids=["json-loop", "code-loop", "table-loop"],
)
def test_runaway_loops_inside_structure_still_trip(text: str) -> None:
    probe = DegenerationProbe(DegenerationConfig(check_every=1), structured=text.startswith("{"))
    assert _stream(text, probe) == LOOP


def test_structure_turns_off_the_entropy_probe() -> None:
    cfg = DegenerationConfig(entropy_window=16, repetition=False)
    json_probe = DegenerationProbe(cfg, structured=True)
    assert feed(json_probe, [f'"k{i}": 0, ' for i in range(40)], CERTAIN) is None
