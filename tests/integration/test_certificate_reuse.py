"""A quantization certificate after launch: reused by a rollout on a new engine version,
read by the verdict API, exported as OpenTelemetry events, and read on its page in a browser.

The launch: a real ``quantdrift preflight`` run of the GPTQ build whose candidate is
served by vLLM 0.31 (a server that answers what vLLM says about itself: vLLM does not
run in this tier), signed by alice and bob with their own Ed25519 keys. The route's
live evidence is what ``quantdrift route status --json`` prints after the breaker's
own store folded the candidate's shadow scores (English and Chinese traffic). The
certificate binds both (``preflight certificate --live``).

Then the same build is rolled out on vLLM 0.32. The verdict API is given the
certificate: Flagger's pre-rollout accepts it, but the first pair from the new engine
restarts the route's evidence (the engine-change rule), and the verdict stays
``inconclusive`` until the route re-arms on its own pairs. A forged certificate makes
the verdict ``fail`` and the pre-rollout a "no".
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import yaml

from quantdrift import otel
from quantdrift.breaker.policy import load_policy
from quantdrift.breaker.store import RedisBreakerStore
from quantdrift.schemas import Metrics, ScoreEvent
from quantdrift.schemas.signing import CommandSigner
from quantdrift.stack import EmbeddedStack, free_port
from support.browser import CHROMIUM, chromium_dom, screenshot
from support.e2e import until_healthz
from support.otlp import Receiver
from support.preflight import KEYS, certified, cli, public, vllm_says
from support.redis_keys import forget_prefix

pytestmark = [pytest.mark.timeout(400)]

ROUTE = "cs-agent/int4"  # the route go_report launches
BUILD = "smol-gptq-int4"
OLD, NEW = f"vllm/0.31.0/{BUILD}", f"vllm/0.32.0/{BUILD}"
TOKEN = "certificate-reuse-test-token"
# The tolerance rule judges each language apart (its slice tests); the route relies on
# its hard and outcome tests, which need no noise floor, so it arms at min_pairs.
POLICY = {
    "default": {"rules": ["tolerance"], "relies_on": ["hard", "outcomes"], "min_pairs": 5,
                "slice_dimensions": ["language"], "slice_min_pairs": 5},
}  # fmt: skip


@dataclass
class Launch:
    env: dict[str, str]
    report: Path
    cert: Path
    keys: dict[str, Path]
    prefix: str
    policy_file: Path
    workdir: Path


def score(i: int, engine: str, language: str) -> ScoreEvent:
    """What the scoring worker writes for a healthy shadow pair of ``engine``."""
    return ScoreEvent(
        pair_id=f"pair-{engine}-{i}",
        route=ROUTE,
        kind="shadow",
        ts=float(i),
        decoding="greedy",
        metrics=Metrics(cosine=0.99, rougeL=0.9),
        candidate_engine=engine,
        tags={"language": language},
    )


async def fold(redis_url: str, prefix: str, policy_file: Path, scores: list[ScoreEvent]) -> None:
    """Fold through the breaker's own store, as the judge does."""
    client = aioredis.Redis.from_url(redis_url)
    store = RedisBreakerStore(client, CommandSigner("ops", KEYS["ops"].encode()), prefix)
    policy = load_policy(policy_file).for_route(ROUTE)
    try:
        for s in scores:
            await store.fold(s, policy, time.time())
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def launch(stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    """The first rollout on vLLM 0.31, its live evidence, and its certificate."""
    tmp = tmp_path_factory.mktemp("certificate-reuse")
    prefix = f"qdtest:{uuid.uuid4().hex}:"
    policy_file = tmp / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(POLICY))
    traffic = [score(i, OLD, "zh" if i % 4 == 3 else "en") for i in range(12)]
    asyncio.run(fold(stack.redis_url, prefix, policy_file, traffic))
    status_env = {
        **os.environ,
        "QUANTDRIFT_REDIS__URL": stack.redis_url,
        "QUANTDRIFT_REDIS__KEY_PREFIX": prefix,
        "QUANTDRIFT_POLICY_FILE": str(policy_file),
    }
    status = cli("route", "status", "--route", ROUTE, "--json", env=status_env, cwd=tmp)
    assert status.returncode == 0, status.stderr
    live = tmp / "live.json"
    live.write_text(status.stdout)
    with vllm_says("0.31.0", BUILD) as engine:
        env, report, cert, keys = certified(tmp, live, "--candidate", engine)
    yield Launch({**env, **status_env}, report, cert, keys, prefix, policy_file, tmp)
    forget_prefix(stack.redis_url, prefix)


def test_the_certificate_binds_the_engine_and_live_evidence_per_slice(launch: Launch) -> None:
    payload = json.loads(json.loads(launch.cert.read_bytes())["payload"])
    assert payload["engine"]["candidate"] == {"engine": "vllm", "version": "0.31.0", "model": BUILD}
    (row,) = json.loads(payload["live"]["text"])
    slices = {s["slice"]: (s["pairs"], s["status"]) for s in row["slices"]}
    assert slices == {"language=en": (9, "testing"), "language=zh": (3, "insufficient_data")}


@dataclass
class Api:
    base: str

    def verdict(self) -> dict[str, Any]:
        reply = httpx.get(
            f"{self.base}/api/v1/routes/{ROUTE}/verdict",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        return reply.json()

    def flagger(self, hook: str) -> int:
        body = {"name": "c", "namespace": "n", "metadata": {"route": ROUTE, "token": TOKEN}}
        return httpx.post(f"{self.base}/api/v1/flagger/{hook}", json=body, timeout=10).status_code


@pytest.fixture
def api(launch: Launch) -> Iterator[Api]:
    """``quantdrift verdict-api --certificate ROUTE=CERT``, no preflight report given."""
    port = free_port()
    env = {**launch.env, "QUANTDRIFT_VERDICT_API__TOKEN": TOKEN}
    log = launch.workdir / f"verdict-api-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "quantdrift", "verdict-api", "--port", str(port),
             "--certificate", f"{ROUTE}={launch.cert}", "--log-level", "warning"],
            env=env, cwd=launch.workdir, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    until_healthz(proc, base, log)
    yield Api(base)
    proc.terminate()
    proc.wait(timeout=10)


def test_a_new_engine_version_starts_from_the_certificate_and_re_arms(
    launch: Launch, api: Api, stack: EmbeddedStack
) -> None:
    # On the certified engine: the route is armed, and the certificate verifies.
    body = api.verdict()
    assert body["verdict"] == "pass" and body["certificate"]["verified"] is True
    assert body["certificate"]["certified_engine"] == OLD == body["certificate"]["serving_engine"]

    # The same build on vLLM 0.32: its first pair restarts the route's evidence.
    asyncio.run(fold(stack.redis_url, launch.prefix, launch.policy_file, [score(0, NEW, "en")]))
    body = api.verdict()
    cert = body["certificate"]
    assert (body["verdict"], body["pairs_seen"], body["armed"]) == ("inconclusive", 1, False)
    assert cert["verified"] is True and cert["engine_changed"] is True
    assert (cert["certified_engine"], cert["serving_engine"]) == (OLD, NEW)
    assert "evidence restarted and it must re-arm" in body["reason"], body["reason"]
    # The rollout starts from the certificate (no report is configured), but is not promoted.
    assert api.flagger("pre-rollout") == 200
    assert api.flagger("confirm-promotion") == 412

    # Its own pairs re-arm it: only then a pass.
    more = [score(i, NEW, "en") for i in range(1, 4)]
    asyncio.run(fold(stack.redis_url, launch.prefix, launch.policy_file, more))
    assert api.verdict()["verdict"] == "inconclusive"  # 4 of 5 pairs
    asyncio.run(fold(stack.redis_url, launch.prefix, launch.policy_file, [score(4, NEW, "en")]))
    body = api.verdict()
    assert body["verdict"] == "pass" and "whose own pairs re-armed the route" in body["reason"]
    assert api.flagger("confirm-promotion") == 200

    # A certificate that does not verify is refused, never a pass (the file is re-read).
    good = launch.cert.read_bytes()
    try:
        launch.cert.write_bytes(good.replace(b"0.31.0", b"0.32.0"))
        body = api.verdict()
        # The route itself stays armed (its tests can fire); the certificate is refused.
        assert body["verdict"] == "fail" and body["certificate"]["verified"] is False
        assert body["reason"] == (
            "certificate refused: bad signature: the certificate was altered or forged"
        )
        assert api.flagger("pre-rollout") == 412 and api.flagger("confirm-promotion") == 412
    finally:
        launch.cert.write_bytes(good)
    assert api.verdict()["verdict"] == "pass"


def test_a_verified_certificate_exports_as_evaluation_events(
    launch: Launch, receiver: Receiver
) -> None:
    env = {**launch.env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
    ran = cli("preflight", "certificate-events", str(launch.cert), env=env, cwd=launch.workdir)
    assert ran.returncode == 0, ran.stderr
    events = receiver.events(otel.EVALUATION_EVENT)
    head = [e["attributes"] for e in events if e["attributes"]["gen_ai.evaluation.name"]
            == otel.CERTIFICATE_NAME]  # fmt: skip
    assert len(head) == 1 and head[0]["gen_ai.evaluation.score.label"] == "verified"
    assert head[0]["quantdrift.candidate_engine"] == OLD
    assert head[0]["quantdrift.certificate.signers"] == ["alice", "bob"]
    files = json.loads(json.loads(launch.cert.read_bytes())["payload"])["model"]["files"]
    assert head[0]["quantdrift.model.files"] == [f"{k}={v}" for k, v in sorted(files.items())]
    slices = {
        e["attributes"]["quantdrift.slice"]: e["attributes"]
        for e in events
        if e["attributes"]["gen_ai.evaluation.name"] == otel.CERTIFICATE_SLICE_NAME
    }
    assert set(slices) == {"all", "language=en", "language=zh"}
    zh = slices["language=zh"]
    assert (zh["gen_ai.evaluation.score.value"], zh["gen_ai.evaluation.score.label"]) == (
        3.0,
        "insufficient_data",
    )
    assert ran.stdout.strip().endswith(
        f"{1 + len(slices)} gen_ai.evaluation.result events exported"
    )

    # One that does not verify is refused, and nothing is exported.
    before = len(receiver.logs)
    forged = launch.workdir / "forged.json"
    forged.write_bytes(launch.cert.read_bytes().replace(b"0.31.0", b"0.30.0"))
    refused = cli("preflight", "certificate-events", str(forged), env=env, cwd=launch.workdir)
    assert refused.returncode != 0 and "does not verify" in refused.stderr
    assert len(receiver.logs) == before


# -- the certificate's page in a browser -------------------------------------------------
def seen(page: Path, shots: Path, state: str) -> tuple[str, list[dict[str, str | None]]]:
    """The page as Chromium rendered it: its DOM and every element's attributes (the
    tag's name under ``tag``); a screenshot of it is kept as ``certificate-STATE.png``."""
    dom = chromium_dom(page.as_uri(), budget_ms=500)
    screenshot(page.as_uri(), shots / f"certificate-{state}.png")

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.attrs: list[dict[str, str | None]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.attrs.append({"tag": tag, **dict(attrs)})

    parser = Rows()
    parser.feed(dom)
    return dom, parser.attrs


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed: make browser")
def test_the_certificate_page_in_a_browser(launch: Launch) -> None:
    shots = launch.workdir / "screenshots"
    shots.mkdir(exist_ok=True)
    envelope = json.loads(launch.cert.read_bytes())
    payload = json.loads(envelope["payload"])
    page = launch.workdir / "page.html"

    def draw(cert: Path, env: dict[str, str]) -> None:
        ran = cli("preflight", "certificate-page", str(cert), "--html", str(page), env=env,
                  cwd=launch.workdir)  # fmt: skip
        assert ran.returncode == 0, ran.stderr

    # The launch page it carries was signed with the approvers' own Ed25519 keys.
    launch_dom = chromium_dom(launch.report.with_suffix(".html").as_uri(), budget_ms=500)
    screenshot(launch.report.with_suffix(".html").as_uri(), shots / "launch-ed25519.png")
    assert 'data-state="complete"' in launch_dom and "Signed and verified" in launch_dom
    approvals = payload["preflight"]["approvals"]
    assert all(a["alg"] == "ed25519" and a["key_id"] in launch_dom for a in approvals)

    # Verified: the issuer, the build's hashes, the engine and the evidence per slice.
    draw(launch.cert, launch.env)
    dom, tags = seen(page, shots, "verified")
    section = next(t for t in tags if t.get("id") == "signature")
    assert section["data-state"] == "verified" and section["data-signature"] == "true"
    assert "Signature: <span" in dom and ">Verified</span>" in dom
    assert f'signed by <code id="issuer">{envelope["key_id"]}</code> (Ed25519)' in dom
    (name, sha), = payload["model"]["files"].items()  # fmt: skip
    assert f'data-file="{name}"' in dom and f'<code class="sha">{sha}</code>' in dom
    assert f"vllm 0.31.0 serving {BUILD}" in dom
    rows = {(t["data-route"], t["data-slice"]) for t in tags if t.get("class") == "slice"}
    assert rows == {(ROUTE, "all"), (ROUTE, "language=en"), (ROUTE, "language=zh")}
    assert '<td class="pairs">9</td><td class="status">testing</td>' in dom
    assert '<td class="pairs">3</td><td class="status">insufficient_data</td>' in dom
    approvals = [t["data-by"] for t in tags if t.get("class") == "approval"]
    assert approvals == ["alice", "bob"] and dom.count("<td>verifies</td>") == 2

    # Tampered: another version of the engine written into the signed bytes.
    tampered = launch.workdir / "tampered.json"
    tampered.write_bytes(launch.cert.read_bytes().replace(b"0.31.0", b"0.29.0"))
    draw(tampered, launch.env)
    dom, tags = seen(page, shots, "tampered")
    section = next(t for t in tags if t.get("id") == "signature")
    assert section["data-state"] == "refused" and section["data-signature"] == "false"
    assert ">Does not verify</span>" in dom
    assert f'claims to be signed by <code id="issuer">{envelope["key_id"]}</code>' in dom
    assert "bad signature: the certificate was altered or forged" in dom
    assert "<b>Unverified:</b>" in dom and "vllm 0.29.0" in dom
    assert dom.count("<td>not verified</td>") == 2

    # An issuer the reader does not trust: only the approvers' public keys are known.
    approvers = json.dumps([str(p) for p in public(launch.keys, "alice", "bob")])
    draw(launch.cert, {**launch.env, "QUANTDRIFT_SIGNING__PUBLIC_KEYS": approvers})
    dom, tags = seen(page, shots, "untrusted")
    assert next(t for t in tags if t.get("id") == "signature")["data-state"] == "refused"
    assert f"signed by {envelope['key_id']}, which is not a trusted public key" in dom
    print(f"\nscreenshots: {sorted(p.name for p in shots.iterdir())} in {shots}")
