"""The gateway as the official ``openai`` SDK meets it: models, usage, ``n``, tool calls,
refusals, ``top_logprobs``, JSON mode, errors, precision preference, auth.

The gateway runs in this process in front of the scripted upstream of
``support.gateway_upstream`` (a behaviour per URL path, in memory): no server, since
what is tested is what the SDK reads, not the socket; every call here
goes through ``openai.AsyncOpenAI``, streaming and not, so a field the SDK cannot
parse fails the test the way it would fail a user.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from quantdrift.detectors.suite import score_pairs
from quantdrift.gateway.http.service import Gateway
from quantdrift.schemas.pair import PairEvent, ToolCall
from quantdrift.stack import free_port
from support.gateway_upstream import (
    GOOD,
    ROOMY,
    ROUTE,
    Scripted,
    in_process,
    make_config,
)

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.timeout(120)]


def config_for(scripted: Scripted, modes: dict[str, Any], **extra: Any) -> Any:
    """The shared test config with roomy timeouts: these tests are about the wire, not time.

    A read gap of 0.5 s (the shared timeout) in this process, which also runs the
    scripted upstream on a thread, would fail a test about tool-call deltas. Timeouts
    and shedding have their own tests (``test_gateway.py``, ``test_gateway_overload.py``);
    ``make_config`` already leaves shedding out of the others.
    """
    return make_config(scripted, modes, **{"timeouts": ROOMY, **extra})


TEAM_KEY, OPS_KEY, ADMIN_TOKEN = "sk-team-a", "sk-ops", "metrics-token"
OTHER_ROUTE = "other/int4"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class FakePublisher:
    """Collects pairs in memory: what ShadowPublisher.offer would have sent to Kafka."""

    def __init__(self) -> None:
        self.pairs: list[Any] = []
        self.connected = True
        self.queue_depth = 0

        class _Stats:
            offered = sent = 0
            dropped: dict[str, int] = {}  # noqa: RUF012

        self.stats = _Stats()

    async def start(self) -> None: ...

    async def stop(self, timeout: float = 5.0) -> None: ...

    def offer(self, pair: Any) -> bool:
        self.pairs.append(pair)
        return True


def gateway_for(up: Scripted, modes: dict[str, Any], **extra: Any) -> Gateway:
    """A gateway over the in-memory scripted upstream (``config_for``'s config)."""
    return Gateway(config_for(up, modes, **extra), transport=up.transport)


def sdk_client(http: httpx.AsyncClient, key: str) -> Any:
    """An AsyncOpenAI client over ``http`` (the gateway in this process; no SDK retries:
    one call, one request)."""
    base = str(http.base_url).rstrip("/")
    return openai.AsyncOpenAI(
        base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=20, http_client=http
    )


@asynccontextmanager
async def sdk(gateway: Gateway, key: str = "unused") -> AsyncIterator[Any]:
    """Serve ``gateway`` (once: its lifespan closes its pools) and yield one SDK client."""
    async with in_process(gateway) as http:
        client = sdk_client(http, key)
        try:
            yield client
        finally:
            await client.close()


def user(text: str = "hi") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def collect(stream: Any) -> tuple[dict[int, str], list[Any]]:
    """Content per choice index, and every chunk."""
    texts: dict[int, str] = {}
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    return texts, chunks


# -- the API ------------------------------------------------------------------------------


async def test_models_list_and_retrieve(scripted_memory: Scripted) -> None:
    async with sdk(gateway_for(scripted_memory, GOOD)) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == [ROUTE]
        assert (await client.models.retrieve(ROUTE)).owned_by == "quantdrift"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("no/such")


async def test_usage_without_and_with_streaming(scripted_memory: Scripted) -> None:
    async with sdk(gateway_for(scripted_memory, GOOD)) as client:
        reply = await client.chat.completions.create(model=ROUTE, messages=user())
        assert reply.choices[0].message.content == "Hello from int4, the answer is forty two."
        assert reply.usage is not None and reply.usage.prompt_tokens == 7
        assert reply.usage.total_tokens == 7 + reply.usage.completion_tokens

        stream = await client.chat.completions.create(
            model=ROUTE, messages=user(), stream=True, stream_options={"include_usage": True}
        )
        texts, chunks = await collect(stream)
        assert texts == {0: "Hello from int4, the answer is forty two."}
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
        assert all(c.usage is None for c in chunks[:-1])

        plain = await client.chat.completions.create(model=ROUTE, messages=user(), stream=True)
        _, chunks = await collect(plain)
        assert all(c.usage is None for c in chunks)  # not asked, not sent


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_n_choices_are_kept_by_index(scripted_memory: Scripted, stream: bool) -> None:
    async with sdk(gateway_for(scripted_memory, GOOD)) as client:
        if stream:
            texts, _ = await collect(
                await client.chat.completions.create(model=ROUTE, messages=user(), n=2, stream=True)
            )
        else:
            reply = await client.chat.completions.create(model=ROUTE, messages=user(), n=2)
            texts = {c.index: c.message.content for c in reply.choices}
        assert sorted(texts) == [0, 1]
        assert texts[0] == "Hello from int4, the answer is forty two."
        assert texts[1] == "[1] Hello from int4, the answer is forty two."


async def test_n_choices_of_a_json_answer(scripted_memory: Scripted) -> None:
    async with sdk(gateway_for(scripted_memory, GOOD)) as client:
        reply = await client.chat.completions.create(
            model=ROUTE, messages=user("json"), n=2, response_format={"type": "json_object"}
        )
        assert [c.index for c in reply.choices] == [0, 1]
        assert json.loads(reply.choices[0].message.content) == {
            "answer": "ok",
            "precision": "int4",
        }


async def test_tool_call_deltas_and_refusal(scripted_memory: Scripted) -> None:
    config = config_for(scripted_memory, {**GOOD, "int4": "tools", "bf16": "refusal"})
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    async with sdk(Gateway(config, transport=scripted_memory.transport)) as client:
        reply = await client.chat.completions.create(model=ROUTE, messages=user(), tools=tools)
        call = reply.choices[0].message.tool_calls[0]
        assert (call.id, call.function.name) == ("call_1", "lookup")
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        assert reply.choices[0].finish_reason == "tool_calls"

        # The SDK's own stream helper accumulates tool-call deltas by index.
        async with client.chat.completions.stream(
            model=ROUTE, messages=user(), tools=tools
        ) as events:
            final = await events.get_final_completion()
        assert final.choices[0].message.tool_calls[0].function.arguments == '{"city": "Paris"}'

        refused = await client.chat.completions.create(
            model=ROUTE, messages=user(), extra_headers={"X-Precision-Preference": "high_precision"}
        )
        assert refused.choices[0].message.refusal == "I can't help with that."
        assert refused.choices[0].message.content is None


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_top_logprobs_as_asked(scripted_memory: Scripted, stream: bool) -> None:
    async with sdk(gateway_for(scripted_memory, GOOD)) as client:
        kw: dict[str, Any] = {"model": ROUTE, "messages": user(), "stream": stream}
        if stream:
            _, chunks = await collect(
                await client.chat.completions.create(**kw, logprobs=True, top_logprobs=2)
            )
            entries = [
                e for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content
            ]
        else:
            reply = await client.chat.completions.create(**kw, logprobs=True, top_logprobs=2)
            entries = reply.choices[0].logprobs.content
        assert entries and all(len(e.top_logprobs) == 2 for e in entries)
        if not stream:
            bare = await client.chat.completions.create(model=ROUTE, messages=user())
            assert bare.choices[0].logprobs is None  # the gateway asked upstream; the user did not


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_json_mode_falls_back_silently(scripted_memory: Scripted, stream: bool) -> None:
    async with sdk(
        Gateway(
            config_for(scripted_memory, {**GOOD, "int4": "badjson"}),
            transport=scripted_memory.transport,
        )
    ) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=ROUTE,
            messages=user("json please"),
            response_format={"type": "json_object"},
            stream=stream,
        )
        reply = raw.parse()
        if stream:
            text = "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
        else:
            text = reply.choices[0].message.content
        assert json.loads(text) == {"answer": "ok", "precision": "int8"}
        assert raw.headers["x-quantdrift-fallbacks"] == "int4:json_invalid_char"


async def test_a_json_answer_cut_by_max_tokens_is_reported_not_retried(
    scripted_memory: Scripted,
) -> None:
    gw = Gateway(
        config_for(scripted_memory, {**GOOD, "int4": "length"}), transport=scripted_memory.transport
    )
    async with sdk(gw) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=ROUTE,
            messages=user("json"),
            response_format={"type": "json_object"},
            max_tokens=12,
        )
        reply = raw.parse()
        assert raw.headers["x-quantdrift-precision"] == "int4"
        assert raw.headers["x-quantdrift-truncated"] == "max_tokens"
        assert "x-quantdrift-fallbacks" not in raw.headers
        assert reply.choices[0].finish_reason == "length"
        assert gw.metrics.value("quantdrift_gateway_truncated_total", json="true") == 1
        assert gw.metrics.value("quantdrift_gateway_fallbacks_total") == 0


# -- errors -----------------------------------------------------------------------------


async def test_errors_have_openai_shape_and_no_internal_hosts(scripted_memory: Scripted) -> None:
    async with sdk(
        Gateway(
            config_for(scripted_memory, {**GOOD, "int4": "e400url"}),
            transport=scripted_memory.transport,
        )
    ) as client:
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model=ROUTE, messages=user())
        message = bad.value.body["message"]
        assert "model not found" in message
        assert "127.0.0.1" not in message and "http://" not in message
        # A model name that is not a route is the upstream's business (the default route);
        # a route asked for by name that does not exist is a 404.
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(
                model="gpt-4o", messages=user(), extra_headers={"X-Quantdrift-Route": "no/such"}
            )
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as unknown:
            await client.chat.completions.create(
                model=ROUTE, messages=user(), extra_body={"frobnicate": 1}
            )
        assert unknown.value.code == "unknown_parameter" and unknown.value.param == "frobnicate"

    dead = f"http://127.0.0.1:{free_port()}"
    async with sdk(
        Gateway(
            config_for(scripted_memory, dict.fromkeys(GOOD, dead)),
            transport=scripted_memory.transport,
        )
    ) as client:
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as failed:
                await client.chat.completions.create(model=ROUTE, messages=user(), stream=stream)
            assert failed.value.status_code == 502
            assert failed.value.code == "upstream_unavailable"
            assert "127.0.0.1" not in json.dumps(failed.value.body)


async def test_allowlisted_extra_fields_pass(scripted_memory: Scripted) -> None:
    config = config_for(scripted_memory, GOOD, extra_body_fields=["top_k"])
    async with sdk(Gateway(config, transport=scripted_memory.transport)) as client:
        marker = "allow-top-k"
        await client.chat.completions.create(
            model=ROUTE, messages=user(marker), extra_body={"top_k": 5}
        )
        sent = [b for b in scripted_memory.calls_to("int4") if marker in json.dumps(b)]
        assert sent and sent[0]["top_k"] == 5


# -- precision preference and auth --------------------------------------------------------


def auth_config(scripted: Scripted, **extra: Any) -> Any:
    return config_for(
        scripted,
        GOOD,
        auth={
            "keys": [
                {"name": "team-a", "sha256": digest(TEAM_KEY), "routes": [ROUTE]},
                {"name": "ops", "sha256": digest(OPS_KEY), "high_precision": True},
            ],
            "admin_token_sha256": digest(ADMIN_TOKEN),
        },
        **extra,
    )


async def test_auth_refusals_are_401_and_403(scripted_memory: Scripted) -> None:
    gw = Gateway(auth_config(scripted_memory), transport=scripted_memory.transport)
    async with in_process(gw) as http:
        nobody, team, ops = (sdk_client(http, k) for k in ("sk-wrong", TEAM_KEY, OPS_KEY))
        with pytest.raises(openai.AuthenticationError) as no:
            await nobody.chat.completions.create(model=ROUTE, messages=user())
        assert no.value.status_code == 401 and no.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await nobody.models.list()
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/health")).status_code == 401
        scrape = await http.get("/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert scrape.status_code == 200
        assert 'quantdrift_gateway_auth_refusals_total{reason="invalid_api_key"} 2.0' in scrape.text

        reply = await team.chat.completions.create(model=ROUTE, messages=user())
        assert reply.choices[0].message.content.startswith("Hello from int4")
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await team.chat.completions.create(
                model=ROUTE, messages=user(), extra_body={"precision_preference": "high_precision"}
            )
        assert denied.value.code == "preference_not_allowed"

        raw = await ops.chat.completions.with_raw_response.create(
            model=ROUTE, messages=user(), extra_headers={"X-Precision-Preference": "high_precision"}
        )
        assert raw.headers["x-quantdrift-precision"] == "bf16"
        assert [m.id for m in (await ops.models.list()).data] == [ROUTE]
        for c in (nobody, team, ops):
            await c.close()


async def test_a_key_sees_and_uses_only_its_routes(scripted_memory: Scripted) -> None:
    data = auth_config(scripted_memory).model_dump()
    data["routes"][OTHER_ROUTE] = dict(data["routes"][ROUTE])
    from quantdrift.gateway.gateway_config import parse_config

    gw = Gateway(parse_config(data), transport=scripted_memory.transport)
    async with sdk(gw, TEAM_KEY) as team:
        assert [m.id for m in (await team.models.list()).data] == [ROUTE]
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await team.chat.completions.create(model=OTHER_ROUTE, messages=user())
        assert denied.value.status_code == 403 and denied.value.code == "route_not_allowed"


# -- capabilities, sampling and privacy ------------------------------------------------------


async def test_a_shadow_pair_records_the_tool_calls_and_the_score_reads_their_arguments(
    scripted_memory: Scripted,
) -> None:
    publisher = FakePublisher()
    config = config_for(scripted_memory, {**GOOD, "int4": "tools"}, shadow_sample_rate=1.0)
    gw = Gateway(config, publisher=publisher, transport=scripted_memory.transport)  # type: ignore[arg-type]
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    async with sdk(gw) as client:
        reply = await client.chat.completions.create(model=ROUTE, messages=user(), tools=tools)
        assert reply.choices[0].message.tool_calls[0].function.name == "lookup"
        await gw.wait_shadows(10)
    (sent,) = publisher.pairs
    pair = PairEvent.parse(sent.model_dump_json())  # as the worker reads it off the topic
    assert pair.tags["output"] == "tool"
    assert pair.candidate.tool_calls == [ToolCall(name="lookup", arguments='{"city": "Paris"}')]
    assert pair.candidate.text == "" and pair.reference.tool_calls is None  # bf16 answered text
    checked = pair.model_copy(
        update={
            "request": pair.request.model_copy(
                update={"expected_answer": '{"city": "paris"}', "answer_kind": "json"}
            )
        }
    )
    (m,) = score_pairs([checked], None)
    assert (m.json_ok, m.answer_ok, m.reference_answer_ok) == (True, True, False)


async def test_a_pool_without_logprobs_serves_and_shadows_text_only(
    scripted_memory: Scripted,
) -> None:
    publisher = FakePublisher()
    config = config_for(
        scripted_memory,
        {**GOOD, "bf16": "nolp"},
        pools={"bf16": {"logprobs": False}},
        shadow_sample_rate=1.0,
    )
    gw = Gateway(config, publisher=publisher, transport=scripted_memory.transport)  # type: ignore[arg-type]
    async with sdk(gw) as client:
        hp = await client.chat.completions.create(
            model=ROUTE,
            messages=user("nolp"),
            extra_headers={"X-Precision-Preference": "high_precision"},
        )
        assert hp.choices[0].message.content.startswith("Hello from bf16")
        await client.chat.completions.create(model=ROUTE, messages=user("pair"))
        await gw.wait_shadows(10)
    assert len(publisher.pairs) == 2
    pair = next(
        p
        for p in publisher.pairs
        if p.candidate.precision == "int4"
        and p.reference.precision == "bf16"
        and p.request.prompt_hash
    )
    assert pair.reference.text.startswith("Hello from bf16")
    assert pair.reference.top_logprobs is None and pair.candidate.top_logprobs
    assert not [
        b for b in scripted_memory.calls_to("bf16") if "logprobs" in b and "nolp" in json.dumps(b)
    ]


async def test_the_caller_cannot_steer_sampling(scripted_memory: Scripted) -> None:
    publisher = FakePublisher()
    gw = Gateway(
        config_for(scripted_memory, GOOD, shadow_sample_rate=0.5),
        publisher=publisher,
        transport=scripted_memory.transport,
    )  # type: ignore[arg-type]
    async with sdk(gw) as client:
        ids = set()
        for _ in range(40):
            raw = await client.chat.completions.with_raw_response.create(
                model=ROUTE, messages=user("same"), extra_headers={"X-Request-Id": "fixed-id"}
            )
            assert raw.headers["x-client-request-id"] == "fixed-id"  # kept, for tracing
            ids.add(raw.headers["x-request-id"])
        await gw.wait_shadows(10)
    assert len(ids) == 40  # the gateway's own ids, whatever the client sends
    # The same X-Request-Id 40 times, yet about half mirrored: the client does not choose.
    assert 5 <= len(publisher.pairs) <= 35


async def test_prompts_leave_as_a_salted_hash_unless_the_route_opts_in(
    scripted_memory: Scripted,
) -> None:
    hashed, clear = FakePublisher(), FakePublisher()
    for publisher, opt_in in ((hashed, False), (clear, True)):
        config = config_for(scripted_memory, GOOD, shadow_sample_rate=1.0, clear_prompts=opt_in)
        gw = Gateway(config, publisher=publisher, transport=scripted_memory.transport)  # type: ignore[arg-type]
        async with sdk(gw) as client:
            for _ in range(2):
                await client.chat.completions.create(model=ROUTE, messages=user("same"))
            await client.chat.completions.create(
                model=ROUTE, messages=user("secret"), extra_headers={"X-Quantdrift-Private": "1"}
            )
            await gw.wait_shadows(10)
    assert len(hashed.pairs) == len(clear.pairs) == 3
    assert all(p.request.prompt is None and p.request.prompt_hash for p in hashed.pairs)
    same = {p.request.prompt_hash for p in hashed.pairs if not p.request.private}
    assert len(same) == 1  # one prompt, one hash: pairs of a prompt stay joinable
    assert same.pop() != hashlib.sha256(b"user: same").hexdigest()  # salted, not a bare sha256
    assert [p.request.prompt for p in clear.pairs if not p.request.private] == ["user: same"] * 2
    secret = [p for p in clear.pairs if p.request.private]
    assert len(secret) == 1 and secret[0].request.prompt is None  # private wins over opt-in


async def test_a_buffered_json_stream_keeps_choices_and_usage(scripted_memory: Scripted) -> None:
    async with sdk(gateway_for(scripted_memory, GOOD)) as client:
        stream = await client.chat.completions.create(
            model=ROUTE,
            messages=user("json"),
            n=2,
            response_format={"type": "json_object"},
            stream=True,
            stream_options={"include_usage": True},
        )
        texts, chunks = await collect(stream)
    assert sorted(texts) == [0, 1]
    assert all(json.loads(t)["precision"] == "int4" for t in texts.values())
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 7


async def test_text_completions_with_fallback_and_usage(scripted_memory: Scripted) -> None:
    async with sdk(
        Gateway(
            config_for(scripted_memory, {**GOOD, "int4": "e500"}),
            transport=scripted_memory.transport,
        )
    ) as client:
        raw = await client.completions.with_raw_response.create(
            model=ROUTE, prompt="Say hi", max_tokens=5
        )
        reply = raw.parse()
        assert reply.choices[0].text == "int8 says hi" and reply.usage.total_tokens == 5
        assert raw.headers["x-quantdrift-fallbacks"] == "int4:upstream_http_500"
        stream = await client.completions.create(
            model=ROUTE, prompt="Say hi", stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == "int8 says hi"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model=ROUTE, prompt="x", extra_body={"nope": 1})
