"""A gateway in another language verifies breaker commands: Node.js, with the README recipe.

The old recipe (re-serialise with sorted keys) failed in JavaScript on ``60.0``;
the envelope signs the exact payload bytes, so Node verifies without re-encoding.
Runs the shipped ``examples/verify_command.js`` with the machine's ``node``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.outbox import build_outbox
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.state import RouteState, Transition
from quantdrift.schemas.signing import CommandSigner

VERIFIER = Path(__file__).resolve().parents[2] / "examples" / "verify_command.js"
KEYS = {"k1": "node-test-key-of-at-least-32-bytes"}
SIGNER = CommandSigner("k1", KEYS["k1"].encode())
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def node_verify(envelope: bytes, keys: dict[str, str] = KEYS) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    return subprocess.run(
        [NODE, str(VERIFIER), json.dumps(keys)],
        input=envelope.decode(),
        capture_output=True,
        text=True,
        timeout=30,
    )


async def breaker_commands() -> list[bytes]:
    """Commands as the breaker issues them: a manual rollback, release, the cool-down's
    half-open (evidence ``cooldown_s: 60.0``, ``percent: 0.0``), and a trip whose
    evidence carries the floats that broke the old recipe."""
    store = MemoryBreakerStore(SIGNER)
    policy = RoutePolicy(cooldown_s=60.0)
    route = "cs-agent/int4"
    await store.manual(route, "rollback", policy, now=1_000.0)
    await store.manual(route, "release", policy, now=1_001.0)
    half_open = await store.tick(route, policy, now=1_100.0)
    assert half_open.outbox is not None
    assert half_open.outbox.command.evidence["cooldown_s"] == 60.0
    trip = Transition(
        "closed",
        "open",
        "rollback",
        "reference",
        "tolerance",
        "e-value 1e+07 over the budget",
        {
            "cooldown_s": 60.0,
            "p_value": 1e-07,
            "effect": 0.1,
            "mean_tf_kl": 0.30000000000000004,
            "worst_pairs": [{"pair_id": "p-1", "similarity": 0.5, "reasons": ["循环"]}],
        },
        "bf16",
    )
    state = RouteState(state="open", epoch=1_700_000_000_123, target="reference")
    tripped = build_outbox(route, trip, state, SIGNER, now=1_700_000_000.123)
    return [*(c for c in store.commands.values()), half_open.outbox.sealed, tripped.sealed]


async def test_node_verifies_every_breaker_command() -> None:
    commands = await breaker_commands()
    for sealed in commands:
        result = node_verify(sealed)
        assert result.returncode == 0, result.stdout + result.stderr
        parsed = json.loads(result.stdout)
        assert parsed == json.loads(json.loads(sealed)["payload"])
    assert '"p_value":1e-7' in json.loads(commands[-1])["payload"]
    assert '"cooldown_s":60.0' in json.loads(commands[-1])["payload"]


async def test_node_refuses_tampered_and_wrong_key() -> None:
    sealed = (await breaker_commands())[-1]
    envelope = json.loads(sealed)
    envelope["payload"] = envelope["payload"].replace('"reference"', '"candidate"', 1)
    tampered = node_verify(json.dumps(envelope).encode())
    assert tampered.returncode == 1 and "signature does not match" in tampered.stdout
    wrong = node_verify(sealed, {"k1": "guessed"})
    assert wrong.returncode == 1 and "signature does not match" in wrong.stdout
    unknown = node_verify(sealed, {"k2": KEYS["k1"]})
    assert unknown.returncode == 1 and "unknown key id" in unknown.stdout
