"""Produce one PairEvent the way a gateway would (run `quantdrift stack up` first).

python examples/produce_pair.py
"""

from __future__ import annotations

import asyncio
import time
import uuid

from quantdrift.cli.common import load_settings, with_stack
from quantdrift.gateway.shadow.publisher import ShadowPublisher
from quantdrift.schemas import ModelOutput, PairEvent, RequestInfo


async def main() -> None:
    settings = with_stack(load_settings())
    publisher = ShadowPublisher(settings.kafka, sample_rate=1.0)
    await publisher.start()
    pair = PairEvent(
        pair_id=str(uuid.uuid4()),
        ts=time.time(),
        route="cs-agent/int4",
        candidate=ModelOutput(text="Paris is the capital of France.", precision="int4"),
        reference=ModelOutput(text="The capital of France is Paris.", precision="bf16"),
        request=RequestInfo(prompt="What is the capital of France?", temperature=0.0),
    )
    accepted = publisher.offer(pair)  # never blocks the request path
    await publisher.stop(timeout=5.0)
    print(f"offered={accepted} stats={publisher.stats}")


if __name__ == "__main__":
    asyncio.run(main())
