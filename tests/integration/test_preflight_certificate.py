"""The quantization certificate across its seams, verified in Python and in Node.js.

A real ``quantdrift preflight`` run (the page test's ``go_report``), two approvals
by ``preflight sign`` with two keys of the ring, live evidence from a real
``quantdrift replay`` of the lab's recorded pairs, then ``preflight certificate``.
The certificate verifies offline from the document alone (and the key ring) with
``preflight verify-certificate`` and with ``examples/verify_certificate.js`` on
Node's built-in crypto; both refuse the same forgeries. Needs ``node`` on PATH.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from quantdrift.schemas.certificate import CERTIFICATE_DOMAIN
from support.preflight import KEYS, ROOT, cli, go_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODE = shutil.which("node")


def node_verify(cert: bytes) -> tuple[int, dict]:
    assert NODE is not None
    out = subprocess.run(
        [NODE, str(ROOT / "examples" / "verify_certificate.js"), json.dumps(KEYS)],
        input=cert,
        capture_output=True,
        timeout=60,
    )
    return out.returncode, json.loads(out.stdout)


def resign(envelope: dict, payload: dict, key: str | None = None) -> bytes:
    """An altered payload: under the original signature (a forger without a key), or
    MAC'd again with ``key`` (a key holder certifying another build than was measured)."""
    text = json.dumps(payload, sort_keys=True)
    sig = envelope["signature"]
    if key is not None:
        sig = hmac.new(key.encode(), CERTIFICATE_DOMAIN + text.encode(), hashlib.sha256).hexdigest()
    return json.dumps({**envelope, "payload": text, "signature": sig}).encode()


@pytest.mark.skipif(NODE is None, reason="node not installed")
def test_certificate_binds_build_report_and_live_evidence(tmp_path: Path) -> None:
    env, report = go_report(tmp_path)
    cert = tmp_path / "cert.json"
    # An unsigned launch is not certified.
    refused = cli(
        "preflight", "certificate", str(report), "--out", str(cert), env=env, cwd=tmp_path
    )
    assert refused.returncode != 0 and "does not verify" in refused.stderr and not cert.exists()

    ml = {**env, "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "ml"}
    for who, e in (("alice", env), ("bob", ml)):
        signed = cli("preflight", "sign", str(report), "--by", who, env=e, cwd=tmp_path)
        assert signed.returncode == 0, signed.stderr
    pairs = resources.files("quantdrift.data").joinpath("lab_pairs.jsonl.gz")
    replay = cli(
        "replay", "--input", str(pairs), "--embedder", "none", "--no-parquet", "--no-progress",
        "--json", "--out", str(tmp_path / "replay"), env=env, cwd=tmp_path,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    live = tmp_path / "live.json"
    live.write_text(replay.stdout)

    issued = cli(
        "preflight", "certificate", str(report), "--out", str(cert), "--live", str(live),
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    assert "live evidence attached" in issued.stdout
    raw = cert.read_bytes()
    envelope = json.loads(raw)
    payload = json.loads(envelope["payload"])
    # What it binds: the exact report bytes, the hashed checkpoint, the approvals, the replay.
    assert base64.b64decode(payload["preflight"]["report"]) == report.read_bytes()
    assert payload["model"]["quant_method"] == "gptq" and payload["model"]["group_size"] == 128
    assert set(payload["model"]["files"]) == {"model.safetensors"}
    assert [a["by"] for a in payload["preflight"]["approvals"]] == ["alice", "bob"]
    assert json.loads(payload["live"]["text"])["routes"]["lab/int2-g64"]["trips"]

    # Verified offline, from the certificate alone: the report and its approvals may go.
    report.unlink()
    checked = cli("preflight", "verify-certificate", str(cert), "--json", env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert json.loads(checked.stdout) == {"ok": True, "signers": ["alice", "bob"], "problems": []}
    code, seen = node_verify(raw)
    assert code == 0 and seen["ok"] is True and seen["signers"] == ["alice", "bob"], seen
    assert seen["route"] == "cs-agent/int4" and seen["model"] == payload["model"]

    # Forgeries both verifiers refuse, for the same reasons: another build's hash, the
    # envelope's bytes edited, an approval by a name that did not sign, and, with a key of
    # the ring, another build than the signed report measured.
    other = {**payload, "model": {**payload["model"], "files": {"model.safetensors": "0" * 64}}}
    renamed = json.loads(json.dumps(payload))
    renamed["preflight"]["approvals"][1]["by"] = "mallory"
    forged = {
        "another build": resign(envelope, other),
        "edited payload": raw.replace(b"gptq", b"awq"),
        "renamed signer": resign(envelope, renamed),
        "re-MAC'd other build": resign(envelope, other, KEYS["ops"]),
    }
    for what, data in forged.items():
        bad = tmp_path / "forged.json"
        bad.write_bytes(data)
        py = cli("preflight", "verify-certificate", str(bad), "--json", env=env, cwd=tmp_path)
        code, seen = node_verify(data)
        assert py.returncode == 1 and code == 1, what
        assert json.loads(py.stdout)["problems"] == seen["problems"], what
    assert seen["problems"] == ["model identity differs from the signed report's checkpoint"]
