"""One convention for every command, checked through the real ``quantdrift`` process:
``--json`` prints exactly one JSON document on stdout, progress never reaches a
pipe, ``--log-level`` is the flag (``--loglevel`` a hidden, warned alias).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from quantdrift.schemas import ModelOutput, PairEvent, RequestInfo
from support import cli as support_cli

SHIPPED = Path(__file__).parents[2] / "src/quantdrift/data/lab_pairs.jsonl.gz"


def quantdrift(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return support_cli.quantdrift(*argv, cwd=cwd, timeout=300)


def pairs_file(tmp_path: Path) -> Path:
    """Healthy and noise pairs on two routes: enough for eval and replay without a model."""
    words = [f"w{i}" for i in range(40)]
    rows = []
    for i in range(40):
        ref = " ".join(words[i % 7 :] + words[: i % 7])
        for kind, route, cand in (
            ("shadow", "lab/int8", ref.replace("w3", "x3")),
            ("noise", "lab/noise", ref.replace("w5", "y5")),
        ):
            rows.append(
                PairEvent(
                    pair_id=f"{kind}-{i}",
                    ts=float(i),
                    route=route,
                    kind=kind,  # type: ignore[arg-type]
                    candidate=ModelOutput(text=cand, precision="int8"),
                    reference=ModelOutput(text=ref),
                    request=RequestInfo(temperature=0.7),
                    label="int8" if kind == "shadow" else "noise",
                ).model_dump_json()
            )
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def one_document(stdout: str) -> object:
    """json.loads refuses a second document ("Extra data"): this is the assertion."""
    assert stdout.endswith("\n") and stdout.count("\n") == 1, stdout[:500]
    return json.loads(stdout)


def test_every_json_flag_prints_one_document(tmp_path: Path) -> None:
    pairs = pairs_file(tmp_path)
    cases: list[list[str]] = [
        ["score", "the cat sat", "a cat sat", "--embedder", "none", "--json"],
        ["eval", "--healthy", str(pairs), "--embedder", "none", "--json"],
        [
            "eval",
            "--healthy",
            str(pairs),
            "--embedder",
            "none",
            "--json",
            "--streams",
            "2",
            "--length",
            "50",
        ],
        ["replay", "--input", str(pairs), "--embedder", "none", "--out", "r", "--json"],
        ["lab", "quality", str(SHIPPED), "--json"],
    ]
    for argv in cases:
        proc = quantdrift(*argv, cwd=tmp_path)
        assert proc.returncode == 0, (argv, proc.stderr[-800:])
        doc = one_document(proc.stdout)
        assert doc, argv


def test_progress_never_reaches_a_pipe(tmp_path: Path) -> None:
    """stderr is a pipe here: scoring hundreds of pairs draws no bar and writes nothing."""
    pairs = pairs_file(tmp_path)
    proc = quantdrift("eval", "--healthy", str(pairs), "--embedder", "none", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-800:]
    proc = quantdrift(
        "replay", "--input", str(pairs), "--embedder", "none", "--out", "r", cwd=tmp_path
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-800:]


def test_log_level_is_the_flag_and_loglevel_a_hidden_warned_alias(tmp_path: Path) -> None:
    for command in ("worker", "gateway"):
        help_text = quantdrift(command, "--help", cwd=tmp_path).stdout
        assert "--log-level" in help_text and "--loglevel" not in help_text
    proc = quantdrift("worker", "--loglevel", "debug", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stderr == "quantdrift: warning: --loglevel is deprecated; use --log-level\n"


def test_durations_carry_their_unit_and_old_names_warn(tmp_path: Path) -> None:
    help_text = quantdrift("alerts", "forward", "--help", cwd=tmp_path).stdout
    for flag in ("--group-wait-s", "--group-interval-s", "--idle-exit-s"):
        assert flag in help_text
    assert "--idle-exit " not in help_text and "--group-wait " not in help_text
    proc = quantdrift("archive", "--dir", "a", "--idle-exit", "1", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stderr == "quantdrift: warning: --idle-exit is deprecated; use --idle-exit-s\n"


def test_outputs_are_flags_schema_export(tmp_path: Path) -> None:
    proc = quantdrift("schema", "export", "--out", "schemas", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "schemas").glob("*.schema.json"))) == 8
    proc = quantdrift("schema", "export", cwd=tmp_path)
    assert proc.returncode == 2 and "needs --out DIR" in proc.stderr


def test_progress_is_drawn_on_a_terminal(tmp_path: Path) -> None:
    """stderr is a pseudo-terminal here: eval draws its scoring bar there, and stdout
    (a pipe) still holds nothing but the one JSON document."""
    import pty
    import select

    pairs = pairs_file(tmp_path)
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTDRIFT_")}
    argv = ["eval", "--healthy", str(pairs), "--embedder", "none", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantdrift", *argv],
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=tmp_path,
        env={**env, "COLUMNS": "100"},
    )
    os.close(slave)
    seen = b""
    while True:  # drain the terminal until the child closes it
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child exited and closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(master)
    assert proc.returncode == 0, seen[-800:]
    assert b"score pairs" in seen  # the bar's label, drawn on the terminal
    one_document(out.decode())
