"""RouteController against the real broker and Redis: obey, refuse, and fall back to Redis."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from quantdrift.config import KafkaSettings
from quantdrift.errors import UnmappableCommand
from quantdrift.gateway.control.controller import RouteController, command_key
from quantdrift.schemas import CommandSigner, CommandVerifier, RouteCommand
from quantdrift.stack import EmbeddedStack, create_topics, free_port
from support.kafka import produce, unique_topic

pytestmark = [pytest.mark.timeout(60)]

KEY = b"control-test-key-of-at-least-32-bytes"
SIGNER = CommandSigner("k1", KEY)


POOLS = {"candidate": "int4", "reference": "bf16"}


def resolve(command: RouteCommand) -> str:
    """What a gateway with pools int4 / bf16 does (gateway/control/targets.py for real configs)."""
    if command.target_precision not in (None, POOLS[command.target]):
        raise UnmappableCommand(f"{command.target_precision} is not {POOLS[command.target]}")
    return POOLS[command.target]


def controller(
    stack: EmbeddedStack, prefix: str, topic: str, verifier: CommandVerifier
) -> RouteController:
    """The controller under test on the session's broker and Redis, under ``prefix``."""
    return RouteController(
        KafkaSettings(bootstrap_servers=stack.bootstrap),
        stack.redis_url,
        verifier,
        key_prefix=prefix,
        control_topic=topic,
        resolve=resolve,
    )


def unsigned(route: str, epoch: int, action: str = "rollback", **extra: object) -> RouteCommand:
    target = "candidate" if action == "restore" else "reference"
    fields: dict[str, object] = {
        "command_id": f"{route}:{epoch}:{uuid.uuid4().hex[:6]}",
        "route": route,
        "action": action,
        "target": target,
        "epoch": epoch,
        "issued_at": time.time(),
        **extra,
    }
    return RouteCommand.model_validate(fields)


def command(route: str, epoch: int, action: str = "rollback", **extra: object) -> bytes:
    """A signed envelope, as the breaker publishes it."""
    return SIGNER.seal(unsigned(route, epoch, action, **extra))


def tampered(raw: bytes, **changes: object) -> bytes:
    envelope = json.loads(raw)
    payload = json.loads(envelope["payload"])
    payload.update(changes)
    envelope["payload"] = json.dumps(payload)
    return json.dumps(envelope).encode()


def new_route() -> str:
    return f"test-{uuid.uuid4().hex[:8]}/int4"


async def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    """Bounded wait on a counter (refusals change no route state, so nothing to wait_for)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


@pytest.fixture
async def control_topic(stack: EmbeddedStack) -> str:
    topic = unique_topic("control")
    await create_topics(stack.bootstrap, [topic], partitions=2)
    return topic


@pytest.fixture
async def redis_client(stack: EmbeddedStack) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(stack.redis_url)
    yield client
    await client.aclose()


async def started(ctl: RouteController, kafka: bool = True) -> RouteController:
    await ctl.start()
    if kafka:
        assert await ctl.wait_kafka_ready(15.0), "controller never positioned on the topic"
    return ctl


async def test_applies_a_signed_command_and_calls_back(
    stack: EmbeddedStack, control_topic: str, redis_prefix: str
) -> None:
    ctl = controller(stack, redis_prefix, control_topic, CommandVerifier({"k1": KEY}))
    seen: list[tuple[str, int]] = []
    sync_seen: list[str] = []

    async def on_change(route: str, cmd: RouteCommand) -> None:
        seen.append((route, cmd.epoch))

    ctl.on_change(on_change)
    ctl.on_change(lambda route, cmd: sync_seen.append(cmd.action))
    await started(ctl)
    try:
        route = new_route()
        assert ctl.target(route) is None and ctl.epoch(route) == 0
        assert ctl.serving(route) == "candidate"

        sent_at = time.monotonic()
        await produce(stack.bootstrap, control_topic, [(route.encode(), command(route, 1))])
        applied = await ctl.wait_for(route, lambda c: c.epoch == 1, timeout=5.0)

        assert applied.action == "rollback"
        assert ctl.target(route) == "bf16" and ctl.serving(route) == "bf16"
        assert ctl.epoch(route) == 1
        state = ctl.state(route)
        assert state is not None and state.source == "kafka" and state.locked is False
        applied_at = ctl.applied_at(route)
        assert applied_at is not None and applied_at - sent_at < 1.0
        assert seen == [(route, 1)] and sync_seen == ["rollback"]

        restore = command(route, 2, "restore", locked=True)
        await produce(stack.bootstrap, control_topic, [(route.encode(), restore)])
        await ctl.wait_for(route, lambda c: c.action == "restore", timeout=5.0)
        assert ctl.target(route) == "int4" and ctl.state(route).locked  # type: ignore[union-attr]
        assert seen == [(route, 1), (route, 2)]
    finally:
        await ctl.stop()


async def test_ignores_forged_replayed_and_stale_commands(
    stack: EmbeddedStack, control_topic: str, redis_prefix: str
) -> None:
    verifier = CommandVerifier({"k1": KEY})
    ctl = controller(stack, redis_prefix, control_topic, verifier)
    changes: list[int] = []
    ctl.on_change(lambda route, cmd: changes.append(cmd.epoch))
    await started(ctl)
    try:
        route = new_route()
        first = command(route, 5)
        bad = [
            b"\x00not json at all",
            b'{"route": "x"}',
            first,  # applied
            first,  # replay of the very same command: a duplicate
            tampered(first, target="candidate"),  # tampered
            CommandSigner("k1", b"guessed").seal(unsigned(route, 9)),  # wrong key
            CommandSigner("k7", KEY).seal(unsigned(route, 9)),  # unknown key id
            command(route, 5, "restore"),  # another command, same epoch
            command(route, 3, "restore"),  # older epoch
            command(route, 7, "restore", issued_at=time.time() - 3600),  # an old restore
            command(route, 7, target_precision="int8"),  # a pool this gateway maps elsewhere
            json.dumps({**json.loads(command(route, 5)), "signature": ""}).encode(),  # unsigned
        ]
        # Same key -> same partition -> read in order, so once the sentinel is applied
        # every message before it has been judged.
        sentinel = command(route, 6, "canary", percent=0.0)
        await produce(
            stack.bootstrap,
            control_topic,
            [(route.encode(), raw) for raw in [*bad, sentinel]],
        )
        await ctl.wait_for(route, lambda c: c.epoch == 6, timeout=5.0)

        assert changes == [5, 6]
        assert ctl.target(route) == "bf16" and ctl.state(route).percent == 0.0  # type: ignore[union-attr]
        assert verifier.refused == {
            "bad_signature": 2,
            "unknown_key": 1,
            "stale_epoch": 2,
            "stale_issued_at": 1,
            "unmappable_target": 1,
            "unsigned": 1,
            "unreadable": 2,
        }
        assert ctl.stats.bad_messages == 2
        assert ctl.stats.duplicates == 1
        assert ctl.stats.applied == 2
    finally:
        await ctl.stop()


async def test_follows_the_redis_key_when_the_topic_is_unreachable(
    stack: EmbeddedStack, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    verifier = CommandVerifier({"k1": KEY})
    ctl = RouteController(
        KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"),
        stack.redis_url,
        verifier,
        key_prefix=redis_prefix,
        resolve=resolve,
        poll_interval_s=0.1,
        scan_interval_s=0.2,
    )
    t0 = time.monotonic()
    await started(ctl, kafka=False)
    assert time.monotonic() - t0 < 4.0, "start() must not wait for Kafka"
    try:
        route = new_route()
        key = command_key(redis_prefix, route)
        await redis_client.set(key, command(route, 1))  # found by SCAN
        await ctl.wait_for(route, lambda c: c.epoch == 1, timeout=5.0)
        assert ctl.target(route) == "bf16" and ctl.state(route).source == "redis"  # type: ignore[union-attr]

        await redis_client.set(key, command(route, 2, "restore"))  # known route
        await ctl.wait_for(route, lambda c: c.epoch == 2, timeout=5.0)
        assert ctl.target(route) == "int4"

        forged = CommandSigner("k1", b"guessed").seal(unsigned(route, 3))
        await redis_client.set(key, forged)
        await wait_until(lambda: verifier.refused.get("bad_signature") == 1, timeout=5.0)
        assert ctl.epoch(route) == 2
        await redis_client.set(key, command(route, 1))  # an old command
        await wait_until(lambda: verifier.refused.get("stale_epoch") == 1, timeout=5.0)
        assert ctl.epoch(route) == 2 and ctl.target(route) == "int4"

        assert not ctl.kafka_ready and ctl.stats.kafka_errors >= 1
        # The same bytes polled again are not re-judged: each refusal counted once.
        assert verifier.refused == {"bad_signature": 1, "stale_epoch": 1}
    finally:
        await ctl.stop()


async def test_start_reads_the_route_keys_before_returning(
    stack: EmbeddedStack, control_topic: str, redis_prefix: str, redis_client: aioredis.Redis
) -> None:
    """A restarting gateway knows a rolled-back route before serving a single request.

    Also shows the Tansu quirk is harmless: "latest" on Tansu re-delivers the tail of
    the last batch (offsets 1-3 here), which the epoch check drops.
    """
    route = new_route()
    history = [command(route, e, "rollback" if e % 2 else "restore") for e in (1, 2, 3, 4)]
    await produce(
        stack.bootstrap,
        control_topic,
        [(route.encode(), c) for c in history],
        linger_ms=50,  # one batch
    )
    await redis_client.set(command_key(redis_prefix, route), history[-1])
    verifier = CommandVerifier({"k1": KEY})
    ctl = controller(stack, redis_prefix, control_topic, verifier)
    changes: list[tuple[int, str]] = []
    ctl.on_change(lambda r, c: changes.append((c.epoch, ctl.state(r).source)))  # type: ignore[union-attr]
    await started(ctl, kafka=False)
    try:
        assert ctl.epoch(route) == 4 and ctl.target(route) == "int4"
        assert await ctl.wait_kafka_ready(15.0)
        await produce(stack.bootstrap, control_topic, [(route.encode(), command(route, 5))])
        await ctl.wait_for(route, lambda c: c.epoch == 5, timeout=5.0)
        assert changes == [(4, "redis"), (5, "kafka")]
        # Whatever the broker re-delivered was dropped by the epoch or duplicate check.
        redelivered = ctl.stats.received["kafka"] - 1
        assert redelivered == verifier.refused.get("stale_epoch", 0) + ctl.stats.duplicates
        assert set(verifier.refused) <= {"stale_epoch"}
    finally:
        await ctl.stop()


async def test_keeps_following_the_topic_when_redis_is_down(
    stack: EmbeddedStack, control_topic: str
) -> None:
    ctl = RouteController(
        KafkaSettings(bootstrap_servers=stack.bootstrap),
        f"redis://127.0.0.1:{free_port()}",
        CommandVerifier({"k1": KEY}),
        control_topic=control_topic,
        resolve=resolve,
        poll_interval_s=0.05,
    )
    await started(ctl)
    try:
        route = new_route()
        ctl.watch(route)
        await produce(stack.bootstrap, control_topic, [(route.encode(), command(route, 1))])
        await ctl.wait_for(route, lambda c: c.epoch == 1, timeout=5.0)
        await wait_until(lambda: ctl.stats.redis_errors >= 2, timeout=5.0)
        assert ctl.target(route) == "bf16"
    finally:
        await ctl.stop()


async def test_wait_for_times_out(stack: EmbeddedStack, redis_prefix: str) -> None:
    ctl = RouteController(
        KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"),
        stack.redis_url,
        CommandVerifier({"k1": KEY}),
        key_prefix=redis_prefix,
    )
    await ctl.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await ctl.wait_for("nobody/int4", lambda c: True, timeout=0.3)
        assert time.monotonic() - t0 < 1.0
    finally:
        await ctl.stop()


@pytest.mark.parametrize(
    ("history", "epoch", "target"),
    [
        # The console's locked rollback is the newest: known from the topic alone.
        ([(1, "rollback", 0.0), (2, "restore", 0.0), (3, "rollback", 0.0)], 3, "bf16"),
        # The newest is a restore too old to obey: refused, and the older rollback is
        # not left standing (only each route's newest command is applied).
        ([(1, "rollback", 0.0), (2, "restore", -3600.0)], 0, None),
    ],
)
async def test_a_start_with_redis_down_replays_the_topic_for_each_routes_newest_command(
    stack: EmbeddedStack,
    control_topic: str,
    history: list[tuple[int, str, float]],
    epoch: int,
    target: str | None,
) -> None:
    route = new_route()
    await produce(
        stack.bootstrap,
        control_topic,
        [
            (route.encode(), command(route, e, action, issued_at=time.time() + age))
            for e, action, age in history
        ],
    )
    ctl = RouteController(
        KafkaSettings(bootstrap_servers=stack.bootstrap),
        f"redis://127.0.0.1:{free_port()}",  # Redis down for the whole test
        CommandVerifier({"k1": KEY}),
        control_topic=control_topic,
        resolve=resolve,
    )
    await ctl.start()
    try:
        assert not ctl.backstop_known  # Redis unreadable: nothing known yet
        assert await ctl.wait_kafka_ready(15.0)
        assert ctl.backstop_known
        assert ctl.epoch(route) == epoch and ctl.target(route) == target
        assert ctl.stats.received["kafka"] == 1  # the newest alone was handled
    finally:
        await ctl.stop()
