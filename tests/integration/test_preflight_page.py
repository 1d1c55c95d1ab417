"""The launch page in a real headless browser, from a real ``quantdrift preflight`` run.

The launcher's path end to end through the command line: ``quantdrift preflight``
runs the static checks (calibration leakage on two files, salient weights and
scale ranges on a small GPTQ-shaped checkpoint, memory bounds on a vLLM command
line, the probes on the example gateway config) and writes the
report and its page; ``preflight sign`` adds approvals with two keys of the
ring and redraws the page; an edit after signing and ``preflight page`` redraws
it. At each state (unsigned, one of two, two of two, tampered) Debian's
chromium, with the status page test's flags, renders the page and the sign-off
block is checked by what it shows; a screenshot of each is kept under the
test's tmp path (printed with ``-s``).

Needs Debian's chromium (``make browser``); the test installs nothing.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from pathlib import Path

import pytest

from support.browser import CHROMIUM, chromium_dom, screenshot
from support.preflight import cli, go_report

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed: make browser"),
]


def text(fragment: str) -> str:
    """What a reader sees of a piece of the DOM: tags dropped, entities and spaces folded."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


def signoff_seen(page: Path, shots: Path, state: str) -> tuple[dict[str, str], str, list[str], str]:
    """(the block's data attributes, its visible text, each signature row's text, the DOM)
    of the page as chromium rendered it; a screenshot of it is kept as ``state``.png."""
    dom = chromium_dom(page.as_uri(), budget_ms=500)
    screenshot(page.as_uri(), shots / f"{state}.png")
    m = re.search(r'<section id="signoff"([^>]*)>(.*?)</section>', dom, re.S)
    assert m, dom[:2000]
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', m.group(1)))
    rows = [text(r) for r in re.findall(r'<tr class="signature".*?</tr>', m.group(2), re.S)]
    return attrs, text(m.group(2)), rows, dom


def test_signoff_states_in_a_browser(tmp_path: Path) -> None:
    env, report = go_report(tmp_path)
    page, ckpt = tmp_path / "report.html", tmp_path / "ckpt"
    shots = tmp_path / "screenshots"
    shots.mkdir()

    # The page of the run itself, unsigned: the checklist in the standard's order and words.
    attrs, block, rows, dom = signoff_seen(page, shots, "unsigned")
    items = re.findall(r'<tr class="item" data-check="([\w-]+)" data-status="([\w ]+)">', dom)
    assert [c for c, _ in items][:3] == ["calibration-leakage", "salient-weights", "niah"]
    assert dict(items) == {
        "calibration-leakage": "pass", "salient-weights": "pass", "niah": "not run",
        "fp8-scales": "pass", "warmup": "not run", "memory-utilization": "pass",
        "shadow-link": "not run", "probes": "pass", "switch-drill": "not run", "load": "not run",
    }  # fmt: skip
    seen = text(dom)
    assert "Go: every check that ran passed (5 of 10 launch items run)." in seen
    # The inputs: the checkpoint the run hashed, with its quantization.
    sha = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    assert f"model.safetensors sha256 {sha[:16]}" in seen
    assert "ckpt (format safetensors, quant method gptq, bits 4.0, group size 128)" in seen
    assert "Memory-utilisation bounds" in seen and "gpu_memory_utilization 0.91" in seen
    assert "between 0.9 and 0.92" in seen
    assert "repetition probe on, entropy probe on" in seen
    assert '{"' not in seen  # no JSON anywhere a person reads

    # Unsigned.
    assert attrs["state"] == "unsigned" and rows == []
    assert "Sign-off: Unsigned (0 of 2)" in block and "2 more signers (0 of 2 so far)" in block

    # One of two.
    signed = cli("preflight", "sign", str(report), "--by", "alice", env=env, cwd=tmp_path)
    assert signed.returncode == 0, signed.stderr
    attrs, block, rows, _ = signoff_seen(page, shots, "one-of-two")
    assert attrs["state"] == "partial" and attrs["valid"] == "1"
    assert "Sign-off: Partly signed (1 of 2)" in block
    assert len(rows) == 1 and rows[0].startswith("alice ") and " ops verifies" in rows[0]
    assert "1 more signer (1 of 2 so far)" in block

    # Two of two, the second with another key of the ring.
    ml = {**env, "QUANTDRIFT_SIGNING__ACTIVE_KEY_ID": "ml"}
    signed = cli("preflight", "sign", str(report), "--by", "bob", env=ml, cwd=tmp_path)
    assert signed.returncode == 0, signed.stderr
    attrs, block, rows, _ = signoff_seen(page, shots, "two-of-two")
    assert attrs["state"] == "complete" and attrs["valid"] == "2"
    assert "Sign-off: Signed and verified (2 of 2)" in block and "Nothing missing." in block
    assert [r.split()[0] for r in rows] == ["alice", "bob"]
    assert all(r.endswith("verifies") for r in rows) and " ml verifies" in rows[1]
    assert cli("preflight", "verify", str(report), env=env, cwd=tmp_path).returncode == 0

    # Tampered: the report edited after both signed, the page redrawn.
    edited = json.loads(report.read_bytes())
    edited["items"][0]["evidence"]["why"] = "edited after sign-off"
    report.write_text(json.dumps(edited, indent=2) + "\n")
    drawn = cli("preflight", "page", str(report), env=env, cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    attrs, block, rows, _ = signoff_seen(page, shots, "tampered")
    assert attrs["state"] == "broken" and attrs["valid"] == "0"
    assert "Sign-off: Signatures do not verify (0 of 2)" in block
    assert all("does not verify signed another version of the report" in r for r in rows)
    assert cli("preflight", "verify", str(report), env=env, cwd=tmp_path).returncode == 1
    print(f"\nscreenshots: {sorted(p.name for p in shots.iterdir())} in {shots}")
