"""What the gateway publishes: sampled pairs and degradation events.

Both go through one bounded producer (``producer.py``: a bounded queue, a
supervised drain task, every drop counted by reason); what differs is only the
topic and the encoder, which live here as plain functions:

* ``ShadowPublisher``: decides deterministically which requests are mirrored
  (``should_mirror``) and sends their pairs to the pairs topic, keyed by
  ``pair_id`` (``encode_pair``), prompts hashed where they must not travel.
* ``DegradationPublisher``: sends DegradationEvents (a silent retry the user
  never saw) to the degradations topic, keyed by route (``encode_degradation``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantdrift.config import KafkaSettings
from quantdrift.errors import SchemaError
from quantdrift.gateway.chain.sampling import sampled
from quantdrift.gateway.shadow.producer import BoundedProducer
from quantdrift.schemas.degradation import DegradationEvent
from quantdrift.schemas.pair import PairEvent
from quantdrift.schemas.privacy import prompt_hash
from quantdrift.schemas.record_keys import pair_record_key

PairItem = PairEvent | Mapping[str, Any]


def encode_pair(
    item: PairItem, *, hash_prompts: bool = False, prompt_salt: str = ""
) -> tuple[bytes, bytes]:
    """(key, value) for the pairs topic, prompts hashed where they must not travel.

    A mapping is validated as a PairEvent first: a pair that is not one raises
    SchemaError (the producer drops it as ``invalid``).
    """
    if isinstance(item, PairEvent):
        request = item.request
        if request.prompt is None or not (hash_prompts or request.private):
            return pair_record_key(item), item.dumps()
        data = item.model_dump(mode="json", exclude_none=True)
    elif isinstance(item, Mapping):
        data = dict(item)
    else:
        raise SchemaError(f"expected a PairEvent or a mapping, got {type(item).__name__}")
    pair = PairEvent.parse(_scrub(data, hash_prompts, prompt_salt))
    return pair_record_key(pair), pair.dumps()


def _scrub(data: dict[str, Any], hash_prompts: bool, prompt_salt: str) -> dict[str, Any]:
    request = data.get("request")
    if not isinstance(request, Mapping):
        return data
    prompt = request.get("prompt")
    if prompt is None or not (hash_prompts or request.get("private")):
        return data
    scrubbed = {k: v for k, v in request.items() if k != "prompt"}
    if isinstance(prompt, str):
        scrubbed["prompt_hash"] = prompt_hash(prompt, prompt_salt)
    return {**data, "request": scrubbed}


def encode_degradation(event: DegradationEvent) -> tuple[bytes, bytes]:
    """(key, value) for the degradations topic: keyed by route, like scores and commands."""
    if isinstance(event, DegradationEvent):
        return event.route.encode(), event.dumps()
    raise SchemaError(f"expected a DegradationEvent, got {type(event).__name__}")


class ShadowPublisher(BoundedProducer[PairItem]):
    """Sample requests, queue pairs, send them to the pairs topic (key = pair_id).

    ``hash_prompts`` replaces every prompt by its salted hash (``prompt_hash`` with
    ``prompt_salt``, the same as the shadow runner's and the DLQ's) before it leaves
    the process; a pair whose ``request.private`` is set never carries its prompt
    either way (it is hashed here rather than refused, so a gateway bug cannot
    leak a private prompt or lose the pair).
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        sample_rate: float,
        queue_size: int = 10_000,
        topic: str | None = None,
        *,
        hash_prompts: bool = False,
        salt: str = "",
        prompt_salt: str = "",
        max_in_flight: int = 1_000,
        log_every: int = 100,
        backoff_s: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate}")
        super().__init__(
            kafka,
            topic or kafka.topics.pairs,
            self._encode_pair,
            queue_size=queue_size,
            max_in_flight=max_in_flight,
            log_every=log_every,
            backoff_s=backoff_s,
            what="shadow pair",
        )
        self._rate = sample_rate
        self._hash_prompts = hash_prompts
        self._salt = salt
        # The Gateway sets it to its own prompt salt when it is left empty here.
        self.prompt_salt = prompt_salt

    @property
    def sample_rate(self) -> float:
        return self._rate

    def should_mirror(self, request_id: str) -> bool:
        """Deterministic: the same request id always gets the same answer."""
        return sampled(request_id, self._rate, self._salt)

    def _encode_pair(self, item: PairItem) -> tuple[bytes, bytes]:
        # Read at send time: the Gateway may set prompt_salt after construction.
        return encode_pair(item, hash_prompts=self._hash_prompts, prompt_salt=self.prompt_salt)


class DegradationPublisher(BoundedProducer[DegradationEvent]):
    """The bounded producer for DegradationEvents, on the degradations topic."""

    def __init__(
        self, kafka: KafkaSettings, topic: str | None = None, queue_size: int = 1000
    ) -> None:
        super().__init__(
            kafka,
            topic or kafka.topics.degradations,
            encode_degradation,
            queue_size=queue_size,
            what="degradation event",
        )
