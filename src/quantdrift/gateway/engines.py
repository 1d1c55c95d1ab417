"""What engine serves a pool: ``GET /version`` and ``GET /v1/models`` (vLLM answers both).

Pairs carry it per side (``ModelOutput.engine``), with the answer's own
``system_fingerprint``: an engine upgrade, a new version or new weights under a
live route is a new candidate, and the evidence must say which one it is about.
Best effort: a server that answers neither gives an empty ``EngineInfo``.
"""

from __future__ import annotations

import contextlib

import httpx

from quantdrift.schemas.pair import EngineInfo


async def identify(client: httpx.AsyncClient, url: str, timeout_s: float = 5.0) -> EngineInfo:
    """The engine, version and model served at ``url``; fields it does not say stay None."""
    engine = version = model = None
    with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError, TypeError):
        r = await client.get(f"{url}/version", timeout=timeout_s)
        v = r.json().get("version") if r.status_code == 200 else None
        if isinstance(v, str):
            engine, version = "vllm", v
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        r = await client.get(f"{url}/v1/models", timeout=timeout_s)
        first = r.json()["data"][0] if r.status_code == 200 else {}
        model = first.get("id") or first.get("root")
        if engine is None and first.get("owned_by") == "vllm":
            engine = "vllm"
    return EngineInfo(engine=engine, version=version, model=model and str(model))
