"""`quantdrift eval --json`: one JSON array, an object per policy, with the documented keys."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from quantdrift.cli import main
from quantdrift.schemas import ModelOutput, PairEvent, RequestInfo

KEYS = {
    "policy",
    "healthy_pairs",
    "false_rollbacks",
    "drifted_pairs",
    "detection_delay_pairs",
    "pairs_per_s",
}


def write(path: Path, pairs: list[PairEvent]) -> Path:
    path.write_text("\n".join(p.model_dump_json() for p in pairs) + "\n")
    return path


def lab_like(tmp_path: Path) -> tuple[Path, Path, Path]:
    rng = random.Random(1)
    vocab = [f"w{i}" for i in range(200)]

    def p(i: int, route: str, kind: str, cand: str, ref: str, label: str) -> PairEvent:
        return PairEvent(
            pair_id=f"{label}-{i}",
            ts=float(i),
            route=route,
            kind=kind,  # type: ignore[arg-type]
            candidate=ModelOutput(text=cand, precision=label),
            reference=ModelOutput(text=ref),
            request=RequestInfo(temperature=0.7),
            label=label,
        )

    refs = [[rng.choice(vocab) for _ in range(15)] for _ in range(60)]
    healthy = [
        p(i, "lab/int8", "shadow", " ".join([*r[:-1], "x"]), " ".join(r), "int8")
        for i, r in enumerate(refs)
    ]
    noise = [
        p(i, "lab/noise", "noise", " ".join([*r[:-2], "y", "z"]), " ".join(r), "noise")
        for i, r in enumerate(refs)
    ]
    drifted = [
        p(i, "lab/int2-g64", "shadow", "zz " * 15, " ".join(r), "int2")
        for i, r in enumerate(refs[:30])
    ]
    return (
        write(tmp_path / "h.jsonl", healthy),
        write(tmp_path / "d.jsonl", drifted),
        write(tmp_path / "n.jsonl", noise),
    )


def test_eval_json_one_object_per_policy(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    h, d, n = lab_like(tmp_path)
    argv = ["eval", "--healthy", str(h), "--drifted", str(d), "--calibrate", str(n)]
    assert main([*argv, "--embedder", "none", "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)  # exactly one document
    assert [r["policy"] for r in rows] == ["default", "seeds"]
    assert all(set(r) >= KEYS for r in rows)
    seq = rows[0]
    assert (seq["healthy_pairs"], seq["drifted_pairs"], seq["false_rollbacks"]) == (60, 30, 0)
    assert seq["detection_delay_pairs"] is not None and seq["detection_delay_pairs"] <= 20
    assert "re-routed onto lab/int8" in captured.err


def test_eval_label_filter_and_table(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    h, d, _n = lab_like(tmp_path)
    argv = ["eval", "--healthy", str(h), "--healthy-label", "int8", "--drifted", str(d)]
    assert main([*argv, "--drifted-label", "int2", "--embedder", "none"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["policy", "pairs", "healthy"]
    assert "scoring: 90 pairs once" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--drifted", "/no/such.jsonl"], "no such file"),
        (["--healthy-label", "int4"], "no pairs"),
        (["--repeat", "0"], "must be >= 1"),
    ],
)
def test_eval_bad_arguments_exit_2(tmp_path: Path, capsys, extra, message) -> None:  # type: ignore[no-untyped-def]
    h, _, _ = lab_like(tmp_path)
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["eval", "--healthy", str(h), "--embedder", "none", *extra]))
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


LONG_KEYS = {
    "policy",
    "streams",
    "healthy_pairs",
    "false_rollbacks",
    "false_rollbacks_per_100k",
    "false_rollbacks_per_100k_upper95",
    "detection_delay_pairs",
    "detection_delay_p90",
    "missed",
    "information_limit_pairs",
}


def test_eval_streams_one_json_array_per_run_and_seeded(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    h, d, n = lab_like(tmp_path)
    argv = ["eval", "--healthy", str(h), "--drifted", str(d), "--calibrate", str(n)]
    argv += ["--embedder", "none", "--json", "--streams", "3", "--length", "400", "--seed", "4"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    rows = json.loads(first)
    assert [r["policy"] for r in rows] == ["default", "seeds"]
    assert all(set(r) >= LONG_KEYS for r in rows)
    default = rows[0]
    assert (default["streams"], default["healthy_pairs"], default["false_rollbacks"]) == (
        3,
        1200,
        0,
    )
    assert default["false_rollbacks_per_100k_upper95"] == pytest.approx(249.6, abs=0.1)
    assert default["missed"] == 0 and default["detection_delay_p90"] <= 20
    # The oracle's bound: a delay can approach it, never beat it by much (it is fitted
    # on these very pairs, so optimistic), and a pool this separable needs few pairs.
    limit = default["information_limit_pairs"]
    assert limit is not None and 0 < limit <= default["detection_delay_pairs"] + 1, default
    assert main(argv) == 0
    assert capsys.readouterr().out == first  # same seed, same streams, same numbers


def test_eval_embedder_builds_exactly_what_it_names(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import quantdrift.embedding.factory as embedders

    monkeypatch.delenv("QUANTDRIFT_EMBEDDING__TIER", raising=False)
    built: list[str] = []
    monkeypatch.setattr(embedders, "build_scorer", lambda e: built.append(e.tier))
    h, _, _ = lab_like(tmp_path)
    for extra in (["--embedder", "static"], ["--embedder", "tiered"], []):
        assert main(["eval", "--healthy", str(h), "--json", *extra]) == 0
    # Without --embedder: the worker's scorer (settings embedding.tier, tiered by default).
    assert built == ["static", "tiered", "tiered"]


LAB_PAIRS = Path(__file__).resolve().parents[2] / "src/quantdrift/data/lab_pairs.jsonl.gz"


def lab_argv(*extra: str) -> list[str]:
    p = str(LAB_PAIRS)
    return [
        "eval", "--healthy", p, "--healthy-label", "int8", "--drifted", p,
        "--drifted-label", "int2", "--calibrate", p, "--blessed-label", "int8", "--holdout",
        "--decoding", "greedy", "--streams", "2", "--length", "150", "--drift-length", "20",
        "--seed", "3", "--embedder", "static", "--policies", "default", "--json", *extra,
    ]  # fmt: skip


@pytest.mark.long
def test_eval_calibration_draws_on_the_lab_pairs(capsys) -> None:  # type: ignore[no-untyped-def]
    # One draw is today's eval, byte for byte.
    assert main(lab_argv("--no-progress")) == 0
    today = capsys.readouterr().out
    assert main(lab_argv("--no-progress", "--calibration-draws", "1")) == 0
    assert capsys.readouterr().out == today
    # Three draws: the same two streams judged from each resampled calibration.
    assert main(lab_argv("--no-progress", "--calibration-draws", "3")) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["streams"], row["healthy_pairs"], row["calibration_draws"]) == (6, 900, 3)
    assert row["false_rollbacks"] == 0 and row["missed"] == 0
    assert row["false_rollbacks_per_100k_upper95"] == pytest.approx(1e5 * 2.9957 / 900, abs=0.1)
    assert len(row["calibration_sources"]) == 3


def test_calibration_draws_never_use_a_streamed_prompt() -> None:
    from quantdrift.evaluation.modes import select
    from quantdrift.services.evaluation import calibration_draws
    from quantdrift.services.pairs import read_pairs

    pairs = read_pairs(LAB_PAIRS)
    streamed = select(pairs, labels=("int8",), part="evaluation", kinds=("shadow",))[:10]
    calibrate = select(pairs, part="calibration") + streamed[:3]  # three leak in
    draws = calibration_draws(calibrate, streamed, draws=4, seed=1)
    keys = {(p.request.prompt_hash, p.request.prompt) for p in streamed}
    assert len(draws) == 4 and all(d for d in draws)
    assert all((p.request.prompt_hash, p.request.prompt) not in keys for d in draws for p in d)
    assert draws == calibration_draws(calibrate, streamed, draws=4, seed=1)  # seeded
    assert draws[0] != draws[1]


def test_eval_says_when_its_streams_replay_few_distinct_pairs(capsys) -> None:  # type: ignore[no-untyped-def]
    from quantdrift.evaluation.modes import select
    from quantdrift.services.pairs import read_pairs

    # Counted apart from the eval: the greedy int8 shadow pairs of the evaluation prompts.
    held_out = select(
        read_pairs(LAB_PAIRS), labels=("int8",), decoding="greedy", part="evaluation",
        kinds=("shadow",),
    )  # fmt: skip
    distinct = len(held_out)
    assert 0 < distinct < 150
    assert main(lab_argv("--no-progress")) == 0  # streams of 150 pairs
    err = capsys.readouterr().err
    assert f"each stream of 150 pairs replays {distinct} distinct healthy pairs" in err
    assert f"each about {150 / distinct:.0f} times" in err
    # Streams no longer than the pairs they draw from carry no such note.
    argv = lab_argv("--no-progress")
    argv[argv.index("--length") + 1] = str(distinct)
    assert main(argv) == 0
    assert "replays" not in capsys.readouterr().err
