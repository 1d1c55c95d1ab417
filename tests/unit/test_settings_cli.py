"""Settings as a newcomer meets them, through the real ``quantdrift`` process:
the generated reference, typo warnings, ``config show``, ``config validate``,
and a settings file for the worker.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from support import cli as support_cli
from support.cli import user_env

ROOT = Path(__file__).resolve().parents[2]


def quantdrift(
    *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return support_cli.quantdrift(*argv, cwd=cwd, env=user_env(env))


def test_docs_settings_md_is_the_generated_reference(tmp_path: Path) -> None:
    """Fails when a setting changes and docs/settings.md was not regenerated:
    run ``make settings-docs`` (``quantdrift config reference > docs/settings.md``)."""
    proc = quantdrift("config", "reference", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (ROOT / "docs" / "settings.md").read_text() == proc.stdout
    # every field of every model is in it, e.g. one from each of the four places
    for name in (
        "`QUANTDRIFT_SIGNING__KEYS`",
        "`QUANTDRIFT_GATEWAY__API_KEYS`",
        "`auth.keys[].sha256`",
        "`default.false_alarm_budget_pairs`",
        "`niah.lengths`",
    ):
        assert name in proc.stdout, name


def test_a_typo_in_a_variable_gets_a_warning_naming_the_right_one(tmp_path: Path) -> None:
    env = {
        "QUANTDRIFT_REDIS_URL": "redis://127.0.0.1:1/0",  # one underscore short
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVER": "x:1",  # missing S
        "QUANTDRIFT_SIGNING__KEYS": '{"k1": "a-secret"}',  # valid: no warning
        "QUANTDRIFT_GATEWAY_API_KEYS": "[]",  # the old name: deprecated, honoured
    }
    proc = quantdrift("config", "show", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "quantdrift: warning: unknown setting QUANTDRIFT_KAFKA__BOOTSTRAP_SERVER is ignored; "
        "did you mean QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS?",
        "quantdrift: warning: unknown setting QUANTDRIFT_REDIS_URL is ignored; "
        "did you mean QUANTDRIFT_REDIS__URL?",
        "quantdrift: warning: QUANTDRIFT_GATEWAY_API_KEYS is deprecated; "
        "use QUANTDRIFT_GATEWAY__API_KEYS",
    ]


def test_config_show_masks_secrets_and_names_each_source(tmp_path: Path) -> None:
    (tmp_path / "settings.yaml").write_text("kafka:\n  partitions: 7\n  linger_ms: 9\n")
    env = {
        "QUANTDRIFT_SIGNING__KEYS": '{"k1": "a-secret-value"}',
        "QUANTDRIFT_REDIS__URL": "redis://:hunter2@127.0.0.1:6399/0",
        "QUANTDRIFT_KAFKA__LINGER_MS": "11",  # the environment wins over the file
    }
    proc = quantdrift(
        "config", "show", "--config", "settings.yaml", "--json", cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "a-secret-value" not in proc.stdout and "hunter2" not in proc.stdout
    rows = {r["name"]: (r["value"], r["source"]) for r in json.loads(proc.stdout)}
    assert rows["QUANTDRIFT_SIGNING__KEYS"] == ("{k1: ********}", "env QUANTDRIFT_SIGNING__KEYS")
    assert rows["QUANTDRIFT_REDIS__URL"] == (
        "redis://:***@127.0.0.1:6399/0",
        "env QUANTDRIFT_REDIS__URL",
    )
    assert rows["QUANTDRIFT_KAFKA__PARTITIONS"] == ("7", "file settings.yaml")
    assert rows["QUANTDRIFT_KAFKA__LINGER_MS"] == ("11", "env QUANTDRIFT_KAFKA__LINGER_MS")
    assert rows["QUANTDRIFT_KAFKA__REPLICATION_FACTOR"] == ("1", "default")


def test_config_show_names_the_stack_state(tmp_path: Path) -> None:
    state = tmp_path / ".quantdrift" / "stack.json"
    state.parent.mkdir()
    state.write_text(
        json.dumps({"bootstrap": "127.0.0.1:19092", "redis_url": "redis://127.0.0.1:16379/0"})
    )
    proc = quantdrift("config", "show", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: (r["value"], r["source"]) for r in json.loads(proc.stdout)}
    assert rows["QUANTDRIFT_REDIS__URL"] == ("redis://127.0.0.1:16379/0", "stack state")
    assert rows["QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS"] == ("127.0.0.1:19092", "stack state")


def test_config_validate_prints_every_error_one_line_each(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("default:\n  min_pairs: -3\n  cooldown_s: abc\n  bogus: 1\n")
    proc = quantdrift("config", "validate", str(bad), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"{bad}: default.min_pairs: Input should be greater than or equal to 1",
        f"{bad}: default.cooldown_s: Input should be a valid number, unable to parse string "
        "as a number",
        f"{bad}: default.bogus: Extra inputs are not permitted",
    ]
    gateway = tmp_path / "gateway.yaml"
    gateway.write_text("shadow_sample_rate: 2\npools: {}\n")
    proc = quantdrift("config", "validate", str(gateway), cwd=tmp_path)
    assert proc.returncode == 2
    assert [ln.split(": ", 2)[1] for ln in proc.stderr.splitlines()] == [
        "precisions",
        "shadow_sample_rate",
    ]
    settings = tmp_path / "settings.yaml"
    settings.write_text("kafka:\n  partitons: 3\nredis:\n  url: 5\n")
    proc = quantdrift("config", "validate", str(settings), "--kind", "settings", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"{settings}: kafka.partitons: unknown key (did you mean partitions?)",
        f"{settings}: redis.url: Input should be a valid string",
    ]


def test_config_validate_accepts_the_shipped_examples(tmp_path: Path) -> None:
    for name, kind in (("gateway", "gateway"), ("policy", "policy"), ("preflight", "preflight")):
        proc = quantdrift(
            "config", "validate", str(ROOT / "examples" / f"{name}.yaml"), cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().endswith(f"valid {kind} file")


def test_worker_config_file_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = quantdrift("worker", "--config", "missing.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == "quantdrift: error: missing.yaml: No such file or directory\n"
    (tmp_path / "w.yaml").write_text("kafka:\n  bootstrap_server: x:1\n")
    proc = quantdrift("worker", "--config", "w.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (
        "quantdrift: error: w.yaml: kafka.bootstrap_server: unknown key "
        "(did you mean bootstrap_servers?)\n"
    )


def test_the_old_gateway_api_keys_name_still_works(tmp_path: Path) -> None:
    import yaml

    from quantdrift.gateway.gateway_config import load_config
    from quantdrift.services.gateway import OLD_ENV_KEYS, with_env_keys

    # Keys need an admin token (the gateway refuses keys without one): the example plus one.
    raw = yaml.safe_load((ROOT / "examples" / "gateway.yaml").read_text())
    raw.setdefault("auth", {})["admin_token_sha256"] = "1" * 64
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    config = load_config(tmp_path / "gateway.yaml")
    keys = [{"name": "old", "sha256": "0" * 64, "routes": ["*"]}]
    added = with_env_keys(config, {OLD_ENV_KEYS: json.dumps(keys)})
    assert "old" in [k.name for k in added.auth.keys]


def test_a_corrupt_stack_state_is_one_line_and_exit_2(tmp_path: Path) -> None:
    state = tmp_path / ".quantdrift" / "stack.json"
    state.parent.mkdir()
    state.write_text("{not json")
    proc = quantdrift("config", "show", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("quantdrift: error: cannot read the stack state")
    assert proc.stderr.count("\n") == 1
