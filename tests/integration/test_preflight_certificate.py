"""The quantization certificate across its seams, verified in Python and in Node.js.

A real ``quantdrift preflight`` run (the page test's ``go_report``), Ed25519 keys from
``preflight keygen``, two approvals by ``preflight sign --key`` with the approvers' own
keys, live evidence from a real ``quantdrift replay`` of the lab's recorded pairs, then
``preflight certificate --key``. The certificate verifies offline from the document
and the public keys alone with ``preflight verify-certificate`` and with
``examples/verify_certificate.js`` on Node's built-in crypto; both refuse the same
forgeries, with the same reasons. Needs ``node`` on PATH.
"""

from __future__ import annotations

import base64
import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

from quantdrift.schemas import ed25519
from quantdrift.schemas.certificate import V1_REFUSED
from support.preflight import (
    cli,
    ed25519_keys,
    go_report,
    node_verify,
    public,
    resign,
    trusting,
)

pytestmark = [pytest.mark.timeout(300)]

NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node not installed")
def test_certificate_binds_build_report_and_live_evidence(tmp_path: Path) -> None:
    env, report = go_report(tmp_path)
    keys = ed25519_keys(tmp_path, env, "issuer", "alice", "bob")
    env = trusting(env, keys)
    cert = tmp_path / "cert.json"
    certify = ("preflight", "certificate", str(report), "--out", str(cert),
               "--key", str(keys["issuer"]))  # fmt: skip
    # An unsigned launch is not certified.
    refused = cli(*certify, env=env, cwd=tmp_path)
    assert refused.returncode != 0 and "does not verify" in refused.stderr and not cert.exists()
    # Nor one approved with the HMAC ring: only a ring holder could check that approval.
    ring_signed = cli("preflight", "sign", str(report), "--by", "carol", env=env, cwd=tmp_path)
    assert ring_signed.returncode == 0, ring_signed.stderr
    refused = cli(*certify, env=env, cwd=tmp_path)
    assert refused.returncode != 0 and "approvals by carol are HMAC-signed" in refused.stderr
    report.with_name(report.name + ".signoff.json").unlink()  # carol withdraws

    for who in ("alice", "bob"):
        signed = cli("preflight", "sign", str(report), "--by", who, "--key", str(keys[who]),
                     env=env, cwd=tmp_path)  # fmt: skip
        assert signed.returncode == 0, signed.stderr
        assert ed25519.PREFIX in signed.stdout
    pairs = resources.files("quantdrift.data").joinpath("lab_pairs.jsonl.gz")
    replay = cli(
        "replay", "--input", str(pairs), "--embedder", "none", "--no-parquet", "--no-progress",
        "--json", "--out", str(tmp_path / "replay"), env=env, cwd=tmp_path,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    live = tmp_path / "live.json"
    live.write_text(replay.stdout)

    issued = cli(*certify, "--live", str(live), env=env, cwd=tmp_path)
    assert issued.returncode == 0, issued.stderr
    assert "live evidence attached" in issued.stdout and "cert.html: verified" in issued.stdout
    raw = cert.read_bytes()
    envelope = json.loads(raw)
    payload = json.loads(envelope["payload"])
    assert envelope["kind"] == "quantdrift.certificate.v2" and envelope["alg"] == "ed25519"
    # What it binds: the exact report bytes, the hashed checkpoint, the approvals, the replay.
    assert base64.b64decode(payload["preflight"]["report"]) == report.read_bytes()
    assert payload["model"]["quant_method"] == "gptq" and payload["model"]["group_size"] == 128
    assert set(payload["model"]["files"]) == {"model.safetensors"}
    assert [a["by"] for a in payload["preflight"]["approvals"]] == ["alice", "bob"]
    assert json.loads(payload["live"]["text"])["routes"]["lab/int2-g64"]["trips"]

    # Verified offline, from the certificate and the public keys alone: no ring, no report.
    report.unlink()
    bare = {k: v for k, v in env.items() if not k.startswith("QUANTDRIFT_SIGNING__")}
    pub = [f"--public-key={p}" for p in public(keys)]
    checked = cli("preflight", "verify-certificate", str(cert), *pub, "--json", env=bare,
                  cwd=tmp_path)  # fmt: skip
    assert checked.returncode == 0, checked.stdout
    issuer = envelope["key_id"]
    assert json.loads(checked.stdout) == {
        "ok": True, "key_id": issuer, "signers": ["alice", "bob"], "problems": [], "evidence": []
    }  # fmt: skip
    code, seen = node_verify(raw, public(keys))
    assert code == 0 and seen["ok"] is True and seen["signers"] == ["alice", "bob"], seen
    assert seen["route"] == "cs-agent/int4" and seen["model"] == payload["model"]
    assert seen["key_id"] == issuer

    # Forgeries both verifiers refuse, for the same reasons: another build's hash, the
    # envelope's bytes edited, an approval by a name that did not sign, another build
    # than the signed report measured signed by the issuer's own key, a certificate
    # whose issuer the verifier does not trust, and a version 1 (HMAC) certificate.
    other = {**payload, "model": {**payload["model"], "files": {"model.safetensors": "0" * 64}}}
    renamed = json.loads(json.dumps(payload))
    renamed["preflight"]["approvals"][1]["by"] = "mallory"
    v1 = {"schema_version": 1, "kind": "quantdrift.certificate.v1", "key_id": "ops",
          "signature": "00" * 32, "payload": envelope["payload"]}  # fmt: skip
    forged = {
        "another build": (resign(envelope, other), public(keys)),
        "edited payload": (raw.replace(b"gptq", b"awq"), public(keys)),
        "renamed signer": (resign(envelope, renamed), public(keys)),
        "re-signed other build": (resign(envelope, other, keys["issuer"]), public(keys)),
        "untrusted issuer": (raw, public(keys, "alice", "bob")),
        "version 1": (json.dumps(v1).encode(), public(keys)),
    }
    reasons = {}
    for what, (data, trusted) in forged.items():
        bad = tmp_path / "forged.json"
        bad.write_bytes(data)
        py = cli("preflight", "verify-certificate", str(bad), "--json",
                 *[f"--public-key={p}" for p in trusted], env=bare, cwd=tmp_path)  # fmt: skip
        code, seen = node_verify(data, trusted)
        assert py.returncode == 1 and code == 1, what
        assert json.loads(py.stdout)["problems"] == seen["problems"], what
        reasons[what] = seen["problems"]
    assert reasons["re-signed other build"] == [
        "model identity differs from the signed report's checkpoint"
    ]
    assert reasons["untrusted issuer"] == [
        f"signed by {issuer}, which is not a trusted public key (give its public key)"
    ]
    assert reasons["version 1"] == [V1_REFUSED]
    assert reasons["renamed signer"] == ["bad signature: the certificate was altered or forged"]
