"""The client side of the endpoint checks: chat, teacher-forced scoring, context length.

Any OpenAI-compatible server works for chat. Teacher-forced log-probs come
from the lab's ``POST /v1/score`` or, failing that, vLLM's ``prompt_logprobs``
on ``/v1/completions`` (the whole text scored; both sides are then measured the
same way, which is what a comparison needs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from quantdrift.errors import QuantdriftError


class EndpointError(QuantdriftError):
    """An endpoint did not answer as an OpenAI-compatible server should."""


@dataclass(frozen=True, slots=True)
class Reply:
    text: str
    latency_s: float
    prompt_tokens: int | None


@dataclass(slots=True)
class Endpoint:
    url: str
    model: str | None = None
    timeout_s: float = 300.0
    api_key: str | None = None

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url.rstrip("/"), timeout=self.timeout_s, headers=self._headers()
        )

    async def chat(
        self, client: httpx.AsyncClient, prompt: str, max_tokens: int = 32, seed: int = 0
    ) -> Reply:
        """One greedy completion; the latency is the whole round trip."""
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
            "seed": seed,
        }
        if self.model:
            body["model"] = self.model
        t0 = time.perf_counter()
        try:
            resp = await client.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{self.url}: {exc!r}") from exc
        latency = time.perf_counter() - t0
        if resp.status_code != 200:
            raise EndpointError(f"{self.url}: HTTP {resp.status_code}: {resp.text[:200]}")
        data = resp.json()
        try:
            text = data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"{self.url}: no choices[0].message.content") from exc
        usage = data.get("usage") or {}
        return Reply(text, latency, usage.get("prompt_tokens"))

    async def continuation_logprobs(
        self, client: httpx.AsyncClient, prompt: str, continuation: str
    ) -> tuple[list[float], str]:
        """(log-probs of the continuation's tokens, method)."""
        try:
            resp = await client.post(
                "/v1/score", json={"prompt": prompt, "continuation": continuation}
            )
            if resp.status_code == 200:
                return [float(x) for x in resp.json()["continuation_logprobs"]], "v1/score"
            if resp.status_code not in (404, 405):
                raise EndpointError(f"{self.url}/v1/score: HTTP {resp.status_code}")
            body: dict[str, Any] = {
                "prompt": f"{prompt}\n{continuation}",
                "max_tokens": 1,
                "prompt_logprobs": 0,
                "temperature": 0,
            }
            if self.model:
                body["model"] = self.model
            resp = await client.post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{self.url}: {exc!r}") from exc
        if resp.status_code != 200:
            raise EndpointError(
                f"{self.url}: neither /v1/score nor prompt_logprobs (HTTP {resp.status_code})"
            )
        entries = resp.json()["choices"][0].get("prompt_logprobs") or []
        out = []
        for e in entries[1:]:  # the first token has no context
            if isinstance(e, dict) and e:
                first = next(iter(e.values()))
                out.append(float(first["logprob"] if isinstance(first, dict) else first))
        if not out:
            raise EndpointError(f"{self.url}: prompt_logprobs came back empty")
        return out, "prompt_logprobs"

    async def context_length(self, client: httpx.AsyncClient) -> int | None:
        """``max_model_len`` from ``/v1/models`` (vLLM), None when the server does not say."""
        try:
            resp = await client.get("/v1/models", timeout=10)
            if resp.status_code != 200:
                return None
            for m in resp.json().get("data") or []:
                n = m.get("max_model_len") or m.get("context_length")
                if isinstance(n, int) and n > 0:
                    return n
        except (httpx.HTTPError, ValueError):
            return None
        return None
