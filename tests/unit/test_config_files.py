"""The YAML configs are read one way: one line naming the file and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from quantdrift.config_env import first_problem, read_yaml, read_yaml_mapping
from quantdrift.errors import ConfigError
from quantdrift.preflight.config import load


def test_a_mapping_is_read_and_an_empty_file_is_an_empty_one(tmp_path: Path) -> None:
    good, empty = tmp_path / "good.yaml", tmp_path / "empty.yaml"
    good.write_text("a: 1\nb: [x]\n")
    empty.write_text("")
    assert read_yaml_mapping(good, "demo config") == {"a": 1, "b": ["x"]}
    assert read_yaml_mapping(empty, "demo config") == {}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "No such file or directory"),
        ("a: [1, 2\n", "invalid YAML: "),
        ("- a\n- b\n", "expected a mapping at the top"),
    ],
)
def test_every_refusal_names_the_file_in_one_line(
    tmp_path: Path, text: str | None, why: str
) -> None:
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_yaml_mapping(path, "demo config")
    message = str(err.value)
    assert message.startswith(f"demo config {path}: ") and why in message
    assert "\n" not in message


def test_read_yaml_without_a_name_says_the_path_alone(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        read_yaml(tmp_path / "x.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'x.yaml'}: ")


class Section(BaseModel):
    port: int


class Tree(BaseModel):
    section: Section


def test_first_problem_gives_the_field_path() -> None:
    with pytest.raises(ValidationError) as err:
        Tree.model_validate({"section": {"port": "x"}})
    assert first_problem(err.value, "demo config").startswith("demo config: section.port: ")
    with pytest.raises(ValidationError) as err:
        Section.model_validate([])
    assert first_problem(err.value, "demo config").startswith("demo config: <root>: ")


def test_the_preflight_config_reads_through_it(tmp_path: Path) -> None:
    path = tmp_path / "PREFLIGHT.yaml"
    path.write_text("- not a mapping\n")
    with pytest.raises(ConfigError, match=r"^preflight config .*: expected a mapping at the top$"):
        load(path)
    path.write_text("niah:\n  per_cell: 0\n")
    with pytest.raises(ConfigError, match=r"^preflight config: niah\.per_cell: "):
        load(path)
    path.write_text("calibration-leakage:\n  calibration: cal.jsonl\n")
    assert load(path).calibration_leakage.calibration == tmp_path / "cal.jsonl"
