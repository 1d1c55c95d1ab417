"""The verdict API process through every breaker state, as Argo Rollouts and Flagger read it.

``quantdrift verdict-api`` runs as its own process against the real Redis; the
route's state is moved only by the breaker's own store (``fold``, ``tick``,
``manual``: the worker's and the console's code paths). At each state the test
asks the API what the controllers ask, through the manifests in ``deploy/``:
the AnalysisTemplate's URL, header and conditions (evaluated with Argo's rules,
ported below), and the Canary's webhooks (judged with Flagger's rule: a status
above 202 is a "no").
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
import yaml

from quantdrift.breaker.policy import RoutePolicy, load_policy
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.config import SigningSettings
from quantdrift.integrations.verdict_api import build_service, create_app
from quantdrift.preflight.report import build_report, passed, report_bytes
from quantdrift.preflight.signoff import sign_file
from quantdrift.schemas import Metrics, ScoreEvent
from quantdrift.schemas.signing import CommandSigner
from quantdrift.stack import EmbeddedStack, free_port
from support.e2e import until_healthz

pytestmark = [pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
ROUTE = "cs-agent/int4"
GATED = "launch/int4"
EVENTS = "events/int4"
UNGATED = "search/fp8"
FLOORLESS = "floorless/int4"
TOKEN = "verdict-api-test-token"
KEYS = {
    "ops": "ops-approval-key-for-tests-32-bytes-long",
    "ml": "ml-approval-key-for-tests-32-bytes-long",
}
POLICY_YAML = {
    "default": {
        "rules": ["consecutive"],
        "consecutive_failures": 3,
        "min_pairs": 5,
        "cooldown_s": 30.0,
        "half_open_pairs": 2,
    },
    # The default rule: its divergence tests need a floor before the route is armed.
    "routes": {FLOORLESS: {"rules": ["tolerance"]}},
}


# -- Argo Rollouts: the web provider's measurement, by its documented rules ----------
def _expr(condition: str, result: dict[str, Any]) -> bool:
    """Evaluate an Argo condition of the form the template uses (``result.x == "v"``,
    joined by ``&&`` / ``||``). Argo runs expr-lang; this subset reads the same in
    Python's grammar, and anything outside it is refused rather than guessed."""
    tree = ast.parse(condition.replace("&&", " and ").replace("||", " or "), mode="eval")

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BoolOp):
            values = [ev(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = ev(node.left), ev(node.comparators[0])
            if isinstance(node.ops[0], ast.Eq):
                return left == right
            if isinstance(node.ops[0], ast.NotEq):
                return left != right
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert node.value.id == "result", condition
            return result.get(node.attr)
        if isinstance(node, ast.Constant):
            return node.value
        raise AssertionError(f"condition outside the supported subset: {condition}")

    return bool(ev(tree))


def argo_phase(metric: dict[str, Any], status: int, body: dict[str, Any]) -> str:
    """Argo's ``EvaluateResult`` (utils/evaluate/evaluate.go); a non-2xx is an Error."""
    if not 200 <= status < 300:
        return "Error"
    success, failure = metric.get("successCondition"), metric.get("failureCondition")
    ok = _expr(success, body) if success else False
    bad = _expr(failure, body) if failure else False
    if not success and not failure:
        return "Successful"
    if success and not failure:
        bad = not ok
    if failure and not success:
        ok = not bad
    if bad:
        return "Failed"
    if not bad and not ok:
        return "Inconclusive"
    return "Successful"


def _manifest(folder: str, kind: str) -> dict[str, Any]:
    for path in sorted((ROOT / "deploy" / folder).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == kind:
                return doc
    raise AssertionError(f"no {kind} under deploy/{folder}")


TEMPLATE = _manifest("argo", "AnalysisTemplate")
CANARY = _manifest("flagger", "Canary")


@dataclass
class Api:
    base: str
    proc: subprocess.Popen[bytes]
    log: Path

    def argo(self, route: str, token: str = TOKEN) -> tuple[str, dict[str, Any]]:
        """One measurement, with the template's own URL, header and conditions."""
        metric = TEMPLATE["spec"]["metrics"][0]
        web = metric["provider"]["web"]
        args = {"route": route, "verdict-api": self.base, "api-token": token}

        def render(text: str) -> str:
            for k, v in args.items():
                text = text.replace("{{args." + k + "}}", v)
            return text

        headers = {h["key"]: render(h["value"]) for h in web["headers"]}
        reply = httpx.get(render(web["url"]), headers=headers, timeout=web["timeoutSeconds"])
        body = reply.json() if reply.headers.get("content-type", "").startswith("app") else {}
        return argo_phase(metric, reply.status_code, body), body

    def flagger(self, hook: str, route: str, token: str = TOKEN, **meta: str) -> httpx.Response:
        """Flagger's POST for the Canary's webhook of type ``hook`` (its payload shape)."""
        spec = next(h for h in CANARY["spec"]["analysis"]["webhooks"] if h["type"] == hook)
        path = spec["url"].split(":8090", 1)[1]
        payload = {
            "name": CANARY["metadata"]["name"],
            "namespace": CANARY["metadata"]["namespace"],
            "phase": "Progressing",
            "checksum": "abc123",
            "metadata": {**spec["metadata"], "route": route, "token": token, **meta},
        }
        return httpx.post(self.base + path, json=payload, timeout=10)


def flagger_says_yes(reply: httpx.Response) -> bool:
    """Flagger's callWebhook: ``if r.StatusCode > 202`` the hook failed."""
    return reply.status_code <= 202


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("verdict-api")


@pytest.fixture(scope="module")
def prefix(stack: EmbeddedStack) -> Iterator[str]:
    """One Redis prefix for the module's API process; each test has its own routes."""
    name = f"qdtest:{uuid.uuid4().hex}:"
    yield name
    client = redis.Redis.from_url(stack.redis_url)
    keys = list(client.scan_iter(match=f"{name}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="module")
def policy_file(workdir: Path) -> Path:
    path = workdir / "policy.yaml"
    path.write_text(yaml.safe_dump(POLICY_YAML))
    return path


@pytest.fixture(scope="module")
def report(workdir: Path) -> Path:
    """A go report from the preflight package, not yet signed."""
    path = workdir / "preflight.json"
    items = [passed("probes", "Probes", {"ok": 3}, {"ok": 3})]
    path.write_bytes(report_bytes(build_report(items, subject={"route": GATED})))
    return path


@pytest.fixture(scope="module")
def api(
    stack: EmbeddedStack, prefix: str, workdir: Path, policy_file: Path, report: Path
) -> Iterator[Api]:
    """One ``quantdrift verdict-api`` process for the module (it takes seconds to start)."""
    tmp_path = workdir
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "QUANTDRIFT_REDIS__URL": stack.redis_url,
        "QUANTDRIFT_REDIS__KEY_PREFIX": prefix,
        "QUANTDRIFT_SIGNING__KEYS": json.dumps(KEYS),
        "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "ops",
        "QUANTDRIFT_POLICY_FILE": str(policy_file),
    }
    log = tmp_path / "verdict-api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "quantdrift", "verdict-api", "--port", str(port)),
                *("--token-file", str(token_file), "--preflight", f"{GATED}={report}"),
                *("--public-url", f"http://127.0.0.1:{port}", "--log-level", "warning"),
            ],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    until_healthz(proc, base, log)
    yield Api(base, proc, log)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
async def store(stack: EmbeddedStack, prefix: str) -> AsyncIterator[RedisBreakerStore]:
    """The breaker's store, signing with the same key ring the API verifies with."""
    client = aioredis.Redis.from_url(stack.redis_url)
    yield RedisBreakerStore(client, CommandSigner("ops", KEYS["ops"].encode()), prefix)
    await client.aclose()


def score(i: int, ok: bool = True) -> ScoreEvent:
    return ScoreEvent(
        pair_id=f"pair-{i}",
        route=ROUTE,
        kind="shadow",
        ts=float(i),
        decoding="greedy",
        metrics=Metrics(cosine=0.99 if ok else 0.2, rougeL=0.9 if ok else 0.1),
        verdict="ok" if ok else "drift",
        reasons=[] if ok else ["cosine 0.200 < 0.88"],
    )


async def test_every_breaker_state_as_argo_and_flagger_read_it(
    api: Api, store: RedisBreakerStore, policy_file: Path
) -> None:
    policy: RoutePolicy = load_policy(policy_file).for_route(ROUTE)
    t0 = time.time()
    n = 0
    table: list[tuple[str, str, str, bool, bool]] = []

    async def fold(count: int, ok: bool, now: float) -> None:
        nonlocal n
        for _ in range(count):
            n += 1
            await store.fold(score(n, ok), policy, now)

    def look(label: str) -> dict[str, Any]:
        phase, body = api.argo(ROUTE)
        promote = flagger_says_yes(api.flagger("confirm-promotion", ROUTE))
        rollback = flagger_says_yes(api.flagger("rollback", ROUTE))
        table.append((label, body["verdict"], phase, promote, rollback))
        return body

    # Never seen: warming, with every pair still needed.
    body = look("unseen")
    assert (body["verdict"], body["known"], body["pairs_needed"]) == ("inconclusive", False, 5)

    # Warming: two pairs of five.
    await fold(2, True, t0)
    body = look("warming")
    assert (body["verdict"], body["pairs_seen"], body["pairs_needed"]) == ("inconclusive", 2, 3)
    assert body["known"] is True and body["last_transition"] is None

    # Closed and armed.
    await fold(3, True, t0 + 1)
    body = look("closed")
    assert (body["verdict"], body["state"], body["pairs_needed"]) == ("pass", "closed", 0)

    # Three failing pairs in a row trip the breaker: open.
    await fold(3, False, t0 + 2)
    body = look("open")
    last = body["last_transition"]
    assert (body["verdict"], body["state"], body["target"]) == ("fail", "open", "reference")
    assert last["rule"] == "consecutive" and last["action"] == "rollback"
    assert last["epoch"] == body["epoch"] > 0
    assert last["evidence"]["decisive_pair_id"] == f"pair-{n}"
    assert {w["pair_id"] for w in body["worst_pairs"]} <= {f"pair-{i}" for i in range(6, 9)}
    assert body["worst_pairs"], "the pairs behind the trip are linked"
    worst = httpx.get(body["worst_pairs_url"], headers={"Authorization": f"Bearer {TOKEN}"})
    assert worst.status_code == 200
    assert worst.json()["decisive_pair_id"] == f"pair-{n}"
    assert worst.json()["worst_pairs"] == body["worst_pairs"]
    open_epoch = body["epoch"]

    # The cool-down passes (the worker's clock ticks): half-open.
    state, _ = await store.read(ROUTE)
    assert state.opened_at is not None
    await store.tick(ROUTE, policy, state.opened_at + policy.cooldown_s + 1)
    body = look("half_open")
    assert (body["verdict"], body["state"]) == ("fail", "half_open")
    assert body["last_transition"]["rule"] == "cooldown" and body["epoch"] > open_epoch

    # Two passing probes restore the candidate: closed again, and armed.
    await fold(2, True, state.opened_at + policy.cooldown_s + 2)
    body = look("restored")
    assert (body["verdict"], body["state"]) == ("pass", "closed")
    assert body["last_transition"]["rule"] == "half_open_probe"

    # An operator's rollback locks the route on the reference.
    now = time.time() + 60
    await store.manual(ROUTE, "rollback", policy, now, who="oncall@cli")
    body = look("locked (rollback)")
    assert (body["verdict"], body["locked"], body["target"]) == ("fail", True, "reference")
    assert body["last_transition"]["rule"] == "manual"
    assert body["last_transition"]["evidence"] == {"who": "oncall@cli"}

    # An operator's restore locks it on the candidate: no promotion, no rollback either.
    await store.manual(ROUTE, "restore", policy, now + 1, who="oncall@cli")
    body = look("locked (restore)")
    assert (body["verdict"], body["locked"], body["target"]) == ("fail", True, "candidate")

    # Released: the breaker judges again, and the route has its pairs.
    await store.manual(ROUTE, "release", policy, now + 2, who="oncall@cli")
    body = look("released")
    assert (body["verdict"], body["locked"]) == ("pass", False)

    print("\nstate | verdict | Argo measurement | confirm-promotion | rollback")
    for row in table:
        print(" | ".join(str(c) for c in row))
    assert [(r[1], r[2], r[3], r[4]) for r in table] == [
        ("inconclusive", "Inconclusive", False, False),
        ("inconclusive", "Inconclusive", False, False),
        ("pass", "Successful", True, False),
        ("fail", "Failed", False, True),
        ("fail", "Failed", False, True),
        ("pass", "Successful", True, False),
        ("fail", "Failed", False, True),
        ("fail", "Failed", False, False),
        ("pass", "Successful", True, False),
    ]

    # Every webhook answer is on the route's audit trail, newest first.
    audit = httpx.get(
        f"{api.base}/api/v1/routes/{ROUTE}/audit",
        headers={"Authorization": f"Bearer {TOKEN}"},
        params={"count": 1000},
    ).json()["entries"]
    assert len(audit) == 2 * len(table)
    assert audit[0]["kind"] == "flagger.rollback" and audit[0]["verdict"] == "pass"


async def test_a_route_whose_divergence_tests_abstain_is_never_a_pass(
    api: Api, store: RedisBreakerStore, policy_file: Path
) -> None:
    """Closed, min_pairs seen, nothing fired, but no floor: inconclusive, and no
    promotion, until the floor the tests need is there."""
    policy = load_policy(policy_file).for_route(FLOORLESS)
    for i in range(8):
        await store.fold(score(i).model_copy(update={"route": FLOORLESS}), policy, time.time())
    phase, body = api.argo(FLOORLESS)
    assert (phase, body["verdict"], body["armed"]) == ("Inconclusive", "inconclusive", False)
    assert body["readiness"] == "partly armed" and body["pairs_needed"] == 0
    assert body["reason"].startswith("partly armed: 8 shadow pairs; abstaining: ")
    assert [m.split(":")[1] for m in body["missing"]] == ["dissimilarity", "lexical"]
    assert not flagger_says_yes(api.flagger("confirm-promotion", FLOORLESS))

    # What `quantdrift calibrate --blessed-label` writes for greedy traffic.
    rows = [{"blessed:cosine": 0.97 + i / 1000, "blessed:rougeL": 0.8 + i / 100} for i in range(12)]
    await store.seed_floor(FLOORLESS, "greedy", rows)
    phase, body = api.argo(FLOORLESS)
    assert (phase, body["verdict"], body["armed"], body["missing"]) == (
        "Successful",
        "pass",
        True,
        [],
    )
    assert flagger_says_yes(api.flagger("confirm-promotion", FLOORLESS))


async def test_pre_rollout_needs_a_go_report_and_two_signers(api: Api, report: Path) -> None:
    signing = SigningSettings(active_key_id="ops", keys=KEYS)  # type: ignore[arg-type]

    reply = api.flagger("pre-rollout", GATED)
    assert not flagger_says_yes(reply)
    assert any("0 distinct signers" in p for p in reply.json()["problems"])

    sign_file(report, "alice", signing, time.time())
    reply = api.flagger("pre-rollout", GATED)
    assert not flagger_says_yes(reply)
    assert any("1 distinct signers" in p for p in reply.json()["problems"])

    sign_file(report, "bob", signing, time.time())
    reply = api.flagger("pre-rollout", GATED)
    assert flagger_says_yes(reply), reply.text
    assert reply.json() == {
        "hook": "pre-rollout",
        "route": GATED,
        "verdict": "inconclusive",
        "ok": True,
        "problems": [],
    }

    # A report edited after it was signed no longer verifies.
    report.write_bytes(report.read_bytes().replace(b'"go"', b'"no-go"'))
    reply = api.flagger("pre-rollout", GATED)
    assert not flagger_says_yes(reply)

    # A route with no report configured never passes pre-rollout.
    reply = api.flagger("pre-rollout", UNGATED)
    assert not flagger_says_yes(reply)
    assert reply.json()["problems"] == ["no preflight report is configured for this route"]


async def test_events_are_audited_and_the_token_is_required(api: Api) -> None:
    message = "Advance llm-int4.serving canary weight 10"
    reply = api.flagger("event", EVENTS, eventMessage=message, eventType="Normal")
    assert reply.status_code == 200
    entry_id = reply.json()["recorded"]
    audit = httpx.get(
        f"{api.base}/api/v1/routes/{EVENTS}/audit", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()["entries"]
    assert audit[0]["id"] == entry_id
    assert audit[0]["kind"] == "flagger.event"
    assert audit[0]["metadata"]["eventMessage"] == message
    assert "token" not in audit[0]["metadata"], "the token is never written to the trail"
    assert audit[0]["canary"]["name"] == "llm-int4"

    # Without the token: 401 everywhere, which Argo counts as an Error, Flagger as a no.
    assert api.argo(EVENTS, token="wrong")[0] == "Error"
    assert httpx.get(f"{api.base}/api/v1/routes/{EVENTS}/verdict").status_code == 401
    for hook in ("pre-rollout", "confirm-promotion", "rollback", "event"):
        reply = api.flagger(hook, EVENTS, token="wrong")
        assert reply.status_code == 401 and not flagger_says_yes(reply)
    # A hook without a route is a clear 400, not a guess.
    reply = httpx.post(
        f"{api.base}/api/v1/flagger/confirm-promotion",
        json={"name": "x", "namespace": "y", "metadata": {"token": TOKEN}},
    )
    assert reply.status_code == 400 and "metadata.route" in reply.json()["error"]


async def test_an_unreachable_redis_is_never_a_pass(policy_file: Path) -> None:
    """Redis down: 503, an Error measurement for Argo and a "no" for every Flagger hook."""
    service = build_service(
        f"redis://127.0.0.1:{free_port()}/0",
        "qd:",
        SigningSettings(active_key_id="ops", keys=KEYS),  # type: ignore[arg-type]
        load_policy(policy_file),
        {},
    )
    app = create_app(service, TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        reply = await client.get(f"/api/v1/routes/{ROUTE}/verdict", headers=auth)
        assert reply.status_code == 503
        assert argo_phase(TEMPLATE["spec"]["metrics"][0], reply.status_code, {}) == "Error"
        for hook in ("confirm-promotion", "rollback", "event"):
            reply = await client.post(
                f"/api/v1/flagger/{hook}",
                json={"name": "c", "namespace": "n", "metadata": {"route": ROUTE}},
                headers=auth,
            )
            assert reply.status_code == 503 and not flagger_says_yes(reply)
        assert (await client.get("/healthz")).status_code == 503
    await service.redis.aclose()
