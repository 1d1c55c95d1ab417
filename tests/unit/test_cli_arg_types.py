"""The CLI's argparse types: one message per mistake, the same in every command."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from quantdrift.cli.common import comma_names, non_negative_int, positive_int
from quantdrift.cli.parsers.lab import register as register_lab
from quantdrift.cli.parsers.preflight import register as register_preflight


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [(positive_int, "1", 1), (positive_int, " 7", 7), (non_negative_int, "0", 0)],
)
def test_whole_numbers_in_range(parse: Callable[[str], int], text: str, value: int) -> None:
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (positive_int, "0", "must be >= 1, got 0"),
        (non_negative_int, "-1", "must be >= 0, got -1"),
        (positive_int, "2.5", "'2.5' is not a whole number"),
        (non_negative_int, "x", "'x' is not a whole number"),
    ],
)
def test_whole_numbers_say_what_is_wrong(
    parse: Callable[[str], int], text: str, message: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse(text)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("text", "names"),
    [("a", ["a"]), (" a , c ", ["a", "c"]), ("a,,b,", ["a", "b"]), ("b,b", ["b", "b"])],
)
def test_comma_names_keeps_the_order_given(text: str, names: list[str]) -> None:
    assert comma_names(text, ("a", "b", "c"), "thing") == names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,x,y", "unknown thing x, y; choose from a, b"),
        (" , ", "unknown thing (none); choose from a, b"),
    ],
)
def test_comma_names_names_every_unknown_one(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        comma_names(text, ("a", "b"), "thing")
    assert str(err.value) == message


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantdrift")
    sub = parser.add_subparsers(dest="command")
    register_lab(sub)
    register_preflight(sub)
    return parser


def test_lab_and_preflight_read_lists_and_numbers_alike(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = _parser()
    args = parser.parse_args(["lab", "generate", "--out", "p.jsonl", "--variants", "int8"])
    assert args.variants == ["int8"] and args.seed == 0
    args = parser.parse_args(["preflight", "--only", "niah, perplexity"])
    assert args.only == ["niah", "perplexity"]
    for argv, message in [
        (["lab", "generate", "--out", "p", "--variants", "int9"], "unknown variant int9"),
        (["lab", "generate", "--out", "p", "--seed", "-1"], "must be >= 0, got -1"),
        (["preflight", "--only", "nope"], "unknown check nope; choose from"),
        (["preflight", "verify", "r.json", "--required", "0"], "must be >= 1, got 0"),
    ]:
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert message in capsys.readouterr().err
