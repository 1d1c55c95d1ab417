"""``quantdrift calibrate``'s sources and ranges, refused before any I/O: one line on
stderr and exit 2 for what the command line got wrong (see ``cli/exits.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantdrift.cli import main
from quantdrift.errors import InputError
from quantdrift.replay.sources import TopicRange
from quantdrift.schemas import ModelOutput, PairEvent
from quantdrift.services.calibration import CalibrationRequest, route_pairs


@pytest.mark.parametrize(
    ("rng", "says"),
    [
        (dict(start_offset=5, stop_offset=5), "empty offset range: --from-offset 5 is not below"),
        (dict(start_offset=9, stop_offset=2), "empty offset range: --from-offset 9"),
        (dict(start_offset=-1), "--from-offset must be >= 0, got -1"),
        (dict(stop_offset=-3), "--to-offset must be >= 0, got -3"),
        (dict(since=200.0, until=100.0), "empty time range: --since 1970-01-01T00:03:20Z"),
        (dict(since=100.0, until=100.0), "is not before --until 1970-01-01T00:01:40Z"),
        (dict(partitions=(0, -1)), "--partition must be >= 0"),
    ],
)
def test_a_range_that_can_hold_nothing_is_refused(rng: dict[str, object], says: str) -> None:
    with pytest.raises(InputError, match=says):
        TopicRange(**rng)  # type: ignore[arg-type]


def test_a_range_says_what_it_reads() -> None:
    assert TopicRange().describe() == "the whole topic"
    assert TopicRange(start_offset=3).describe() == "offsets [3, )"
    got = TopicRange(since=0.0, until=60.0, partitions=(1,)).describe()
    assert got == "time [1970-01-01T00:00:00Z, 1970-01-01T00:01:00Z), partitions 1"


def test_a_request_reads_one_source() -> None:
    with pytest.raises(InputError, match="needs a pairs file or a topic"):
        CalibrationRequest()
    with pytest.raises(InputError, match="not both"):
        CalibrationRequest(pairs=Path("p.jsonl"), topic="")
    with pytest.raises(InputError, match="--route must not be empty"):
        CalibrationRequest(topic="", routes=("",))
    CalibrationRequest(topic="")  # the settings' pairs topic, all of it


def pair(i: int, route: str) -> PairEvent:
    out = ModelOutput(text="a")
    return PairEvent(pair_id=f"p{i}", ts=0.0, route=route, candidate=out, reference=out)


def test_a_topic_is_filtered_to_the_route_asked_for() -> None:
    topic = [pair(1, "a/int4"), pair(2, "b/int4"), pair(1, "a/int4"), pair(3, "a/int4")]
    assert [p.pair_id for p in route_pairs(topic, ["a/int4"], "t")] == ["p1", "p3"]
    assert [p.pair_id for p in route_pairs(topic, [], "t")] == ["p1", "p2", "p3"]
    with pytest.raises(InputError) as err:
        route_pairs(topic, ["c/int4"], "topic q @ host:9092, the whole topic")
    assert str(err.value) == (
        "nothing to calibrate from topic q @ host:9092, the whole topic: no pairs of route "
        "c/int4 in the range (it holds a/int4, b/int4)"
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "calibrate: give a pairs file, or --topic to read one"),
        (["pairs.jsonl", "--topic"], "calibrate: give a pairs file or --topic, not both"),
        (["pairs.jsonl", "--since", "1h"], "calibrate: --since bound a topic; add --topic"),
        (
            ["pairs.jsonl", "--from-offset", "1", "--partition", "0"],
            "calibrate: --from-offset, --partition bound a topic; add --topic",
        ),
        (["--topic", "--from-offset", "7", "--to-offset", "7"], "empty offset range"),
        (["--topic", "--since", "1h", "--until", "2h"], "empty time range"),
        (["--topic", "--since", "yesterday"], "cannot read time 'yesterday'"),
    ],
)
def test_the_command_line_refuses_a_bad_source_in_one_line(
    argv: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # no .quantdrift/stack.json here
    # A broker where nothing listens: a refusal that reached it would not be exit 2.
    monkeypatch.setenv("QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    assert main(["calibrate", *argv, "--embedder", "none"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("quantdrift: error: "), err
    assert says in err
