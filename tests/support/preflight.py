"""A real ``quantdrift preflight`` run that says go, as the launch page's and the
certificate's tests start from it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from quantdrift.stack import free_port
from support.cli import quantdrift

ROOT = Path(__file__).resolve().parents[2]  # the checkout


KEYS = {"ops": "ops-approval-key-for-tests-32-bytes+", "ml": "ml-approval-key-for-tests-32-bytes+"}


def gptq_checkpoint(path: Path) -> Path:
    """A tiny GPTQ-shaped checkpoint: fp16 embeddings, head and edge layers, a 4-bit middle."""
    from safetensors.numpy import save_file

    path.mkdir()
    f16 = np.zeros((16, 16), dtype=np.float16)
    save_file(
        {
            "model.embed_tokens.weight": np.zeros((32, 16), dtype=np.float16),
            "lm_head.weight": np.zeros((32, 16), dtype=np.float16),
            "model.layers.0.mlp.down_proj.weight": f16,
            "model.layers.1.mlp.down_proj.qweight": np.zeros((8, 64), dtype=np.int32),
            "model.layers.1.mlp.down_proj.scales": np.ones((1, 64), dtype=np.float16),
            "model.layers.2.mlp.down_proj.weight": f16,
        },
        str(path / "model.safetensors"),
    )
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    return path


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return quantdrift(*args, cwd=cwd, env=env)


def go_report(tmp_path: Path, *extra: str) -> tuple[dict[str, str], Path]:
    """A real ``quantdrift preflight`` run that says go: (the environment, the report).

    ``extra``: more ``quantdrift preflight`` flags (e.g. ``--candidate URL``)."""
    env = {
        **os.environ,
        "QUANTDRIFT_SIGNING__KEYS": json.dumps(KEYS),
        "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "ops",
        "QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # no broker needed
    }
    (tmp_path / "calib.jsonl").write_text(
        "\n".join(
            json.dumps({"text": t, "domain": d})
            for t, d in [
                ("The TrailLite backpack holds forty litres and weighs little.", "catalog"),
                ("Coupons apply to the subtotal before shipping, one per order.", "coupon-rules"),
            ]
        )
    )
    (tmp_path / "eval.jsonl").write_text(
        json.dumps({"text": "How do I return shoes that do not fit?", "domain": "support-qa"})
    )
    (tmp_path / "serve.sh").write_text("vllm serve /models/m --gpu-memory-utilization 0.91\n")
    gptq_checkpoint(tmp_path / "ckpt")
    (tmp_path / "preflight.yaml").write_text(
        "salient-weights: {checkpoint: ckpt}\n"
        "calibration-leakage: {calibration: calib.jsonl, evaluation: eval.jsonl,"
        " domains: [catalog, coupon-rules]}\n"
        "memory-utilization: {serving_config: serve.sh}\n"
        "signoff: {required: 2}\n"
    )
    report = tmp_path / "report.json"
    ran = cli(
        "preflight", "--config", "preflight.yaml",
        "--only", "calibration-leakage,salient-weights,fp8-scales,memory-utilization,probes",
        "--gateway-config", str(ROOT / "examples" / "gateway.yaml"), "--route", "cs-agent/int4",
        "--report", str(report), "--quiet", *extra,
        env=env, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert json.loads(report.read_bytes())["verdict"] == "go"
    return env, report


def ed25519_keys(tmp_path: Path, env: dict[str, str], *names: str) -> dict[str, Path]:
    """``quantdrift preflight keygen`` for each name: {name: private key file}; the
    public key is beside it (``KEY.pub``)."""
    keys = {}
    for name in names:
        path = tmp_path / "keys" / f"{name}.pem"
        made = cli("preflight", "keygen", str(path), env=env, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        keys[name] = path
    return keys


def trusting(env: dict[str, str], keys: dict[str, Path]) -> dict[str, str]:
    """``env`` whose settings trust the public keys of ``keys`` (signing.public_keys)."""
    public = [str(p.with_name(p.name + ".pub")) for p in keys.values()]
    return {**env, "QUANTDRIFT_SIGNING__PUBLIC_KEYS": json.dumps(public)}


def certified(
    tmp_path: Path, live: Path | None = None, *extra: str
) -> tuple[dict[str, str], Path, Path, dict[str, Path]]:
    """A real go report (``extra``: more preflight flags), approved by alice and bob with
    their own Ed25519 keys (``preflight sign --key``), and its certificate issued with the
    issuer's key: (environment trusting the three public keys, report, certificate, keys)."""
    env, report = go_report(tmp_path, *extra)
    keys = ed25519_keys(tmp_path, env, "issuer", "alice", "bob")
    env = trusting(env, keys)
    for who in ("alice", "bob"):
        signed = cli("preflight", "sign", str(report), "--by", who, "--key", str(keys[who]),
                     env=env, cwd=tmp_path)  # fmt: skip
        assert signed.returncode == 0, signed.stderr
    cert = tmp_path / "cert.json"
    extra = ["--live", str(live)] if live is not None else []
    issued = cli("preflight", "certificate", str(report), "--out", str(cert),
                 "--key", str(keys["issuer"]), *extra, env=env, cwd=tmp_path)  # fmt: skip
    assert issued.returncode == 0, issued.stderr
    return env, report, cert, keys


def resign(envelope: dict, payload: dict, key: Path | None = None) -> bytes:
    """A certificate with an altered payload: under the original signature (a forger
    without a key), or signed again with the private key ``key`` (an issuer certifying
    what was not measured)."""
    from quantdrift.schemas import ed25519
    from quantdrift.schemas.certificate import CERTIFICATE_DOMAIN

    text = json.dumps(payload, sort_keys=True)
    sig = envelope["signature"]
    if key is not None:
        sig = ed25519.sign(ed25519.load_private(key), CERTIFICATE_DOMAIN + text.encode())
    return json.dumps({**envelope, "payload": text, "signature": sig}).encode()


def node_verify(cert: bytes, keys: list[Path]) -> tuple[int, dict]:
    """``examples/verify_certificate.js`` on ``cert`` with the public key files ``keys``."""
    node = shutil.which("node")
    assert node is not None
    out = subprocess.run(
        [node, str(ROOT / "examples" / "verify_certificate.js"), *map(str, keys)],
        input=cert,
        capture_output=True,
        timeout=60,
    )
    return out.returncode, json.loads(out.stdout)


def public(keys: dict[str, Path], *names: str) -> list[Path]:
    """The public key files of ``names`` (all of ``keys`` when none is named)."""
    return [keys[n].with_name(keys[n].name + ".pub") for n in (names or tuple(keys))]


@contextlib.contextmanager
def vllm_says(version: str, model: str) -> Iterator[str]:
    """A server that says what a vLLM engine says about itself (``GET /version``,
    ``GET /v1/models``), for a preflight run to record the candidate's engine: a real
    vLLM is not started in this tier. Yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answers = {
                "/version": {"version": version},
                "/v1/models": {"object": "list", "data": [{"id": model, "owned_by": "vllm"}]},
            }
            body = json.dumps(answers.get(self.path, {"error": "not found"})).encode()
            self.send_response(200 if self.path in answers else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        thread.join(5)
