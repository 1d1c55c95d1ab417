"""What was launched: the endpoints' engines and the checkpoint's identity, for the report.

The engine comes from the gateway's own ``gateway.engines.identify`` (vLLM's
``GET /version`` and ``GET /v1/models``), so a report and a pair name an engine
the same way; ``quantdrift lab serve`` answers neither and says its model and
precision on ``GET /health``. The checkpoint's identity is what a certificate
binds: SHA-256 of every weight file (streamed, so a large checkpoint costs
read time, not memory), its format, quantization method, bits and group size.
Both are best effort for the page: an endpoint that says nothing is "not
reported", never a failed launch (the checks judge the model, not its labels).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from pathlib import Path
from typing import Any

import httpx

from quantdrift.errors import ConfigError
from quantdrift.gateway.upstream.client import PoolClient
from quantdrift.gateway.upstream.engines import identify
from quantdrift.preflight import weights

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt")
_CHUNK = 1 << 20


async def engine(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """{engine, version, model} of the server at ``url``; values it does not say are None."""
    client = PoolClient(2, connect_s=timeout_s, read_s=timeout_s, acquire_s=timeout_s)
    try:
        info = await identify(client, url.rstrip("/"), timeout_s)
    finally:
        await client.aclose()
    out: dict[str, Any] = {"engine": info.engine, "version": info.version, "model": info.model}
    if info.engine is None:
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
            async with httpx.AsyncClient(timeout=timeout_s) as c:
                r = await c.get(f"{url.rstrip('/')}/health")
            health = r.json() if r.status_code == 200 else {}
            if health.get("precision") and health.get("model"):  # the lab's server
                out.update(
                    engine="quantdrift lab serve",
                    model=f"{health['model']}@{health['precision']}",
                )
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise ConfigError(f"{path}: no weight files ({', '.join(WEIGHT_SUFFIXES)})")
    return files


def checkpoint(path: Path) -> dict[str, Any]:
    """Name, format, quantization and per-file SHA-256 of a checkpoint (reads every byte)."""
    try:
        insp = weights.inspect(path)
        files = {p.name: sha256_file(p) for p in weight_files(path)}
    except OSError as exc:
        raise ConfigError(f"checkpoint {path}: {exc.strerror or exc}") from exc
    qc = insp.quantization_config
    return {
        "name": path.name,
        "format": insp.format,
        "quant_method": qc.get("quant_method"),
        "bits": weights.quant_bits(qc),
        "group_size": qc.get("group_size"),
        "files": files,
    }


async def subject_identity(cfg: Any) -> dict[str, Any]:
    """The report's ``engines`` and ``checkpoint`` for a preflight config."""
    engines = {}
    for side in ("candidate", "reference"):
        ep = getattr(cfg, side)
        if ep is not None:
            engines[side] = await engine(ep.url)
    ck = cfg.salient_weights.checkpoint or cfg.fp8_scales.checkpoint
    out: dict[str, Any] = {"engines": engines}
    if ck is not None:
        try:
            out["checkpoint"] = await asyncio.to_thread(checkpoint, Path(ck))
        except ConfigError as exc:  # the salient-weights check reports the same problem
            out["checkpoint_error"] = str(exc)
    return out
