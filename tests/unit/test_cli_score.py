"""`quantdrift score` as on-call runs it on a worst pair (no embedder: no model load)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from quantdrift.cli import main


def test_json_has_every_metric_the_verdict_and_reasons(capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(
        [
            "score",
            "The cat sat on the mat.",
            "The cat sat on a mat.",
            "--json",
            "--embedder",
            "none",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {"rouge1", "rougeL", "bleu", "cosine", "verdict", "reasons", "jaccard"} <= set(out)
    assert out["rouge1"] == pytest.approx(0.8333333333333334) and out["cosine"] is None
    assert all(0.0 <= out[k] <= 1.0 for k in ("rouge1", "rougeL", "bleu"))
    assert (out["verdict"], out["reasons"]) == ("ok", [])


def test_texts_from_a_file_and_from_stdin(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "ref.txt").write_text("长城是中国古代的军事防御工程", encoding="utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO("长城是中国古代的军事防御工程"))
    assert main(["score", "-", f"@{tmp_path / 'ref.txt'}", "--json", "--embedder", "none"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rougeL"] == 1.0 and out["first_divergence"] is None


def test_drifted_pair_shows_reasons_in_the_table(capsys) -> None:  # type: ignore[no-untyped-def]
    loop = "I can help. " + "the the the " * 30
    assert (
        main(["score", loop, "Open Settings and click Reset password.", "--embedder", "none"]) == 0
    )
    out = capsys.readouterr().out
    assert "verdict" in out and "anomaly" in out and "repetition loop" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["score", "a", "@/no/such/file", "--embedder", "none"], "no such file"),
        (["score", "-", "-", "--embedder", "none"], "only one of"),
        (["score", "a", "b", "--embedder", "bert"], "invalid choice"),
        (["score", "a"], "required"),
    ],
)
def test_bad_arguments_one_line_on_stderr_exit_2(argv, message, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
