"""What engine serves a pool: ``GET /version`` and ``GET /v1/models`` (vLLM answers both).

Pairs carry it per side (``ModelOutput.engine``), with the answer's own
``system_fingerprint``: an engine upgrade, a new version or new weights under a
live route is a new candidate, and the evidence must say which one it is about.
Best effort: a server that answers neither gives an empty ``EngineInfo``.
"""

from __future__ import annotations

import asyncio
import contextlib

from quantdrift.gateway.upstream.client import CALL_ERRORS, PoolClient
from quantdrift.schemas.pair import EngineInfo


async def identify(client: PoolClient, url: str, timeout_s: float = 5.0) -> EngineInfo:
    """The engine, version and model served at ``url``; fields it does not say stay None."""
    engine = version = model = None
    with contextlib.suppress(*CALL_ERRORS, ValueError, AttributeError, TypeError):
        async with asyncio.timeout(timeout_s):
            r = await client.get(f"{url}/version")
        v = r.json().get("version") if r.status == 200 else None
        if isinstance(v, str):
            engine, version = "vllm", v
    with contextlib.suppress(*CALL_ERRORS, ValueError, KeyError, IndexError, TypeError):
        async with asyncio.timeout(timeout_s):
            r = await client.get(f"{url}/v1/models")
        first = r.json()["data"][0] if r.status == 200 else {}
        model = first.get("id") or first.get("root")
        if engine is None and first.get("owned_by") == "vllm":
            engine = "vllm"
    return EngineInfo(engine=engine, version=version, model=model and str(model))
