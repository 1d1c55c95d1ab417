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
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from importlib import resources
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
from support.preflight import KEYS, certified, cli, node_verify, public, resign, vllm_says
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


# The launch's pairs: one a minute from T0 (the gateway's own stamps), two of them less
# alike than the rest (still healthy): the worst pairs.
T0 = 1_765_000_000.0
LESS_ALIKE = {4: 0.93, 9: 0.95}
LAB_PAIRS = resources.files("quantdrift.data").joinpath("lab_pairs.jsonl.gz")


@dataclass
class Launch:
    env: dict[str, str]
    report: Path
    cert: Path
    keys: dict[str, Path]
    prefix: str
    policy_file: Path
    workdir: Path
    floors: dict[str, dict[str, Any]]  # what `quantdrift calibrate --json` wrote, by mode


def score(i: int, engine: str, language: str) -> ScoreEvent:
    """What the scoring worker writes for a healthy shadow pair of ``engine``."""
    return ScoreEvent(
        pair_id=f"pair-{engine}-{i}",
        route=ROUTE,
        kind="shadow",
        ts=T0 + 60.0 * i,
        decoding="greedy",
        metrics=Metrics(cosine=LESS_ALIKE.get(i, 0.99), rougeL=0.9),
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
    status_env = {
        **os.environ,
        "QUANTDRIFT_REDIS__URL": stack.redis_url,
        "QUANTDRIFT_REDIS__KEY_PREFIX": prefix,
        "QUANTDRIFT_POLICY_FILE": str(policy_file),
    }
    # The route's calibration: the lab's noise pairs and its int8 build blessed.
    calibrated = cli("calibrate", str(LAB_PAIRS), "--route", ROUTE, "--blessed-label", "int8",
                     "--embedder", "none", "--no-progress", "--json",
                     env=status_env, cwd=tmp)  # fmt: skip
    assert calibrated.returncode == 0, calibrated.stderr
    floors = {r["mode"]: r for r in json.loads(calibrated.stdout)}
    traffic = [score(i, OLD, "zh" if i % 4 == 3 else "en") for i in range(12)]
    asyncio.run(fold(stack.redis_url, prefix, policy_file, traffic))
    status = cli("route", "status", "--route", ROUTE, "--json", env=status_env, cwd=tmp)
    assert status.returncode == 0, status.stderr
    live = tmp / "live.json"
    live.write_text(status.stdout)
    with vllm_says("0.31.0", BUILD) as engine:
        env, report, cert, keys = certified(tmp, live, "--candidate", engine)
    yield Launch({**env, **status_env}, report, cert, keys, prefix, policy_file, tmp, floors)
    forget_prefix(stack.redis_url, prefix)


def test_the_certificate_binds_the_engine_and_live_evidence_per_slice(launch: Launch) -> None:
    payload = json.loads(json.loads(launch.cert.read_bytes())["payload"])
    assert payload["engine"]["candidate"] == {"engine": "vllm", "version": "0.31.0", "model": BUILD}
    (row,) = json.loads(payload["live"]["text"])
    slices = {s["slice"]: (s["pairs"], s["status"]) for s in row["slices"]}
    assert slices == {"language=en": (9, "testing"), "language=zh": (3, "insufficient_data")}
    # The route's own verdict and its tests' e-values, as each slice has its own.
    assert row["verdict"] == "pass" and {"hard", "outcomes"} <= set(row["tests"])
    assert all(t["pairs"] == 12 and t["log_r_max"] > 0 for t in row["tests"].values())
    # The time window: the first and the last pair's own time.
    assert row["window"] == {"first_pair_at": T0, "last_pair_at": T0 + 660.0}
    # The calibration it was judged against: the floors `quantdrift calibrate` wrote, by
    # the hash calibrate printed, with the blessing's size apart from the noise pairs'.
    floors = {c["mode"]: c for c in row["calibration"]}
    assert {m: c["sha256"] for m, c in floors.items()} == {
        m: f["sha256"] for m, f in launch.floors.items()
    }
    assert floors["greedy"]["noise_pairs"] == 0 and floors["greedy"]["blessed_pairs"] == 40
    assert floors["sampled"]["noise_pairs"] == launch.floors["sampled"]["floor_pairs"] > 0
    assert floors["sampled"]["blessed_pairs"] == 40
    # The worst pairs, worst first, by the hash of their ids (no request id in the clear).
    assert [w["pair_sha256"] for w in row["worst_pairs"][:2]] == [
        pair_hash(f"pair-{OLD}-{i}") for i in sorted(LESS_ALIKE, key=LESS_ALIKE.get)
    ]
    assert [w["similarity"] for w in row["worst_pairs"][:2]] == sorted(LESS_ALIKE.values())
    assert f"pair-{OLD}" not in payload["live"]["text"]


def pair_hash(pair_id: str) -> str:
    return hashlib.sha256(pair_id.encode()).hexdigest()


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_both_verifiers_check_the_live_evidence(launch: Launch) -> None:
    """Python and Node print the same evidence, and refuse the same inconsistent one
    (signed by the issuer's own key, so only the evidence checks can catch it)."""
    env = {k: v for k, v in launch.env.items() if not k.startswith("QUANTDRIFT_SIGNING__")}
    keys = public(launch.keys)
    raw = launch.cert.read_bytes()

    def both(data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        bad = launch.workdir / "checked.json"
        bad.write_bytes(data)
        py = cli("preflight", "verify-certificate", str(bad), "--json",
                 *[f"--public-key={k}" for k in keys], env=env, cwd=launch.workdir)  # fmt: skip
        code, js = node_verify(data, keys)
        assert py.returncode == code, (py.stdout, js)
        return json.loads(py.stdout), js

    py, js = both(raw)
    assert py["ok"] is True and js["ok"] is True
    assert py["evidence"] == js["evidence"]
    (bound,) = py["evidence"]
    assert (bound["route"], bound["pairs"]) == (ROUTE, 12)
    assert bound["window"] == {"first_pair_at": T0, "last_pair_at": T0 + 660.0}
    text = cli("preflight", "verify-certificate", str(launch.cert),
               *[f"--public-key={k}" for k in keys], env=env, cwd=launch.workdir)  # fmt: skip
    assert f"evidence {ROUTE}: 12 pairs from 2025-12-06T05:46:40Z to 2025-12-06T05:57:40Z" in (
        text.stdout
    ), text.stdout
    greedy = launch.floors["greedy"]["sha256"]
    assert f"calibration greedy: 0 noise + 40 blessed pairs, sha256 {greedy}" in text.stdout

    envelope = json.loads(raw)
    payload = json.loads(envelope["payload"])

    def live_edited(edit: Any) -> bytes:
        rows = json.loads(payload["live"]["text"])
        edit(rows[0])
        text = json.dumps(rows)
        live = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}
        return resign(envelope, {**payload, "live": live}, launch.keys["issuer"])

    later = payload["issued_at"] + 3600
    cases = {
        "from the future": (
            lambda r: r.update(window={"first_pair_at": T0, "last_pair_at": later}),
            [f"live evidence {ROUTE}: its time window ends after the certificate was issued"],
        ),
        "reversed": (
            lambda r: r.update(window={"first_pair_at": T0 + 1, "last_pair_at": T0}),
            [f"live evidence {ROUTE}: its time window ends before it starts"],
        ),
        "no window": (
            lambda r: r.update(window=None),
            [f"live evidence {ROUTE}: no time window for its 12 pairs"],
        ),
        "an old route status": (
            lambda r: [r.pop(k) for k in ("window", "calibration", "worst_pairs")],
            [f"live evidence {ROUTE}: carries no window, calibration, worst_pairs"],
        ),
        "a pair id in the clear": (
            lambda r: r["worst_pairs"][0].update(pair_sha256=f"pair-{OLD}-4"),
            [f"live evidence {ROUTE}: worst_pairs 1: not a SHA-256"],
        ),
        "a floor without a hash": (
            lambda r: r["calibration"][1].pop("sha256"),
            [f"live evidence {ROUTE}: calibration 2: not a SHA-256"],
        ),
    }
    for what, (edit, problems) in cases.items():
        py, js = both(live_edited(edit))
        assert py["ok"] is False and py["problems"] == js["problems"] == problems, what

    # The issuer is refused such evidence before signing: an old route status document.
    old = json.loads(payload["live"]["text"])
    for k in ("window", "calibration", "worst_pairs"):
        old[0].pop(k)
    stale = launch.workdir / "stale-live.json"
    stale.write_text(json.dumps(old))
    out = launch.workdir / "stale-cert.json"
    refused = cli("preflight", "certificate", str(launch.report), "--out", str(out), "--key",
                  str(launch.keys["issuer"]), "--live", str(stale), env=launch.env,
                  cwd=launch.workdir)  # fmt: skip
    assert refused.returncode != 0 and not out.exists()
    assert "carries no window, calibration, worst_pairs" in refused.stderr, refused.stderr


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
    # The route's row carries the time window, the calibration and the worst pairs by hash.
    route = slices["all"]
    assert (
        route["quantdrift.evidence.first_pair_at"],
        route["quantdrift.evidence.last_pair_at"],
    ) == (
        T0,
        T0 + 660.0,
    )
    for mode, floor in launch.floors.items():
        assert route[f"quantdrift.calibration.{mode}.sha256"] == floor["sha256"]
        assert route[f"quantdrift.calibration.{mode}.blessed_pairs"] == 40
    assert route["quantdrift.calibration.greedy.noise_pairs"] == 0
    worst = [pair_hash(f"pair-{OLD}-{i}") for i in sorted(LESS_ALIKE, key=LESS_ALIKE.get)]
    assert route["quantdrift.worst_pairs.sha256"][:2] == worst

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
    tests = json.loads(payload["live"]["text"])[0]["tests"].values()
    e_value = format(round(math.exp(max(t["log_r_max"] for t in tests)), 3), "g")
    assert f'<td class="pairs">12</td><td class="status">armed</td><td>{e_value}</td>' in dom
    assert "<td>verdict pass: closed and armed" in dom
    approvals = [t["data-by"] for t in tags if t.get("class") == "approval"]
    assert approvals == ["alice", "bob"] and dom.count("<td>verifies</td>") == 2
    # What the evidence covers: its pairs' time window, its calibration, its worst pairs.
    assert next(t for t in tags if t.get("class") == "bound")["data-route"] == ROUTE
    assert (
        '12 pairs judged, from <time class="first">2025-12-06 05:46:40 UTC</time> to '
        '<time class="last">2025-12-06 05:57:40 UTC</time>'
    ) in dom
    assert [t["data-mode"] for t in tags if t.get("class") == "floor"] == ["greedy", "sampled"]
    assert '<td class="noise">0</td><td class="blessed">40</td>' in dom
    for floor in launch.floors.values():
        assert f'<code class="sha">{floor["sha256"]}</code>' in dom
    assert dom.count('<tr class="worst">') == 3 and f"pair-{OLD}" not in dom
    worst = pair_hash(f"pair-{OLD}-{min(LESS_ALIKE, key=LESS_ALIKE.get)}")
    assert f'<code class="sha">{worst}</code></td><td>0.930</td>' in dom

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
