"""Text completions carry slice tags: a slice held apart from its route holds its
``/v1/completions`` requests as it holds its chats.

The gateway runs in this process in front of the scripted upstream, its controller
following a control topic of the embedded broker; the openai SDK sends text completions
in English and Chinese. The commands are the breaker's own (``support.slice_walk``:
scores folded by the store every worker uses, a Chinese drift rolled back by slice,
then half-open, then restored), signed and produced onto the topic as the outbox relay
would. Which pool serves each language is read from ``x-quantdrift-precision`` and from
the calls each upstream received.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.config import KafkaSettings, TopicNames
from quantdrift.gateway.chain.slices import DIMENSIONS
from quantdrift.gateway.control.controller import RouteController
from quantdrift.gateway.control.targets import resolver_for
from quantdrift.gateway.http.service import Gateway
from quantdrift.schemas import CommandVerifier
from quantdrift.stack import EmbeddedStack, create_topics
from support.gateway_upstream import GOOD, ROOMY, ROUTE, Scripted, in_process, make_config
from support.kafka import produce, unique_topic
from support.slice_walk import KEY, SliceWalk

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.timeout(120)]

POLICY = RoutePolicy(
    rollback_scope="slice", slice_dimensions=("language",), slice_min_pairs=5, min_pairs=5,
    cooldown_s=10.0, half_open_pairs=2,
)  # fmt: skip
EN = "Write one sentence about the capital of France."
ZH = "请用一句话介绍法国的首都巴黎。"


async def test_a_held_language_slice_holds_its_text_completions(
    scripted_memory: Scripted, stack: EmbeddedStack, redis_prefix: str
) -> None:
    # The breaker's three commands: Chinese rolled back, half-open after the cool-down,
    # restored after its probe. Issued in the last seconds, so none is too old or early.
    walk = SliceWalk(POLICY, route=ROUTE, now=time.time() - 12)
    await walk.until_command("zh")
    await walk.tick(walk.now + 11)
    while len(walk.commands) < 3:
        await walk.pair("zh", False)
    rollback, probe, restore = walk.sealed
    assert [c.action for c in walk.commands] == ["rollback", "canary", "restore"]

    control = unique_topic("control")
    await create_topics(stack.bootstrap, [control], partitions=1)
    kafka = KafkaSettings(bootstrap_servers=stack.bootstrap, topics=TopicNames(control=control))
    config = make_config(scripted_memory, GOOD, timeouts=ROOMY)
    controller = RouteController(
        kafka,
        stack.redis_url,
        CommandVerifier({"k1": KEY}),
        key_prefix=redis_prefix,
        control_topic=control,
        resolve=resolver_for(config),
        slice_dimensions=DIMENSIONS,
    )
    gw = Gateway(config, controller=controller, transport=scripted_memory.transport)

    def int4_texts() -> int:
        return sum(1 for _, path, _ in scripted_memory.calls if path == "int4/text")

    async with in_process(gw) as http:
        client = openai.AsyncOpenAI(
            base_url=str(http.base_url).rstrip("/") + "/v1",
            api_key="unused",
            max_retries=0,
            http_client=http,
        )

        async def served(prompt: str, **kw: Any) -> str:
            raw = await client.completions.with_raw_response.create(
                model=ROUTE, prompt=prompt, max_tokens=5, **kw
            )
            assert raw.parse().choices[0].text.endswith("says hi")
            return raw.headers["x-quantdrift-precision"]

        async def streamed(prompt: str) -> str:
            raw = await client.completions.with_raw_response.create(
                model=ROUTE, prompt=prompt, max_tokens=5, stream=True
            )
            text = "".join([c.choices[0].text async for c in raw.parse() if c.choices])
            assert text.endswith("says hi")
            return raw.headers["x-quantdrift-precision"]

        async def apply(sealed: bytes, action: str) -> None:
            await produce(stack.bootstrap, control, [(ROUTE.encode(), sealed)])
            await controller.wait_for(ROUTE, lambda c: c.action == action, timeout=10)

        assert await controller.wait_kafka_ready(15)
        assert [await served(EN), await served(ZH)] == ["int4", "int4"]

        await apply(rollback, "rollback")
        before = int4_texts()
        assert await served(ZH) == "bf16"
        assert await streamed(ZH) == "bf16"
        assert int4_texts() == before, "no int4 call for a held slice's text completion"
        assert await served(EN) == "int4"  # the rest of the route stays on its candidate
        assert [s.key for s in controller.slices(ROUTE)] == ["language=zh"]

        await apply(probe, "canary")  # half-open: the reference still serves the slice
        assert await served(ZH) == "bf16"
        assert await served(EN) == "int4"

        await apply(restore, "restore")
        assert controller.slices(ROUTE) == ()
        assert [await served(ZH), await served(EN)] == ["int4", "int4"]
