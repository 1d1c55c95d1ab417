"""An oversized body's 413 reaches the client, whatever the timing, with one upload.

The gateway answers a body past ``limits.max_body_bytes`` before reading it. A
client still sending when the answer goes out used to see a connection reset
instead of the 413 when the gateway closed the socket (``urllib`` says
``Connection: close``), and the openai SDK, which retries connection errors,
uploads the body again each time. The gateway now lingers as nginx does
(``gateway/http/lingering.py``): it shuts its write side after the answer and
discards what still arrives, so the client reads the 413 and then sees the end.

Against the CLI's gateway with ``examples/gateway.yaml`` as it ships
(``max_body_bytes`` 8 MiB), 20 MB and 100 MB bodies, from the openai SDK,
``http.client``, ``urllib`` and a raw-socket sender that waits for the answer to
arrive before it sends the rest of its body in paced chunks; once on an idle
machine and once with every core busy (a busy loop per core, in subprocesses
that stop themselves). Uploads are counted by the gateway's own request counter
(``requests_total{outcome="too_large"}``), and by the SDK's transport.
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import httpx
import openai
import orjson
import psutil
import pytest

from quantdrift.gateway.http.lingering import IDLE_S
from quantdrift.stack import EmbeddedStack
from support.gateway_process import EXAMPLE_CONFIG, GatewayProcess

pytestmark = [pytest.mark.timeout(180)]

ROUTE = "cs-agent/int4"  # examples/gateway.yaml's route
MB = 1 << 20
SIZES = [20, 100]
TOO_LARGE = "quantdrift_gateway_requests_total"
# A busy loop that stops itself: a test killed before its teardown leaves no load behind.
BUSY = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)
BUSY_MAX_S = 120.0


@pytest.fixture(scope="module")
def gateway(
    fault_stack: EmbeddedStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """The example config as it ships; no control plane (the 413 needs none)."""
    env = {"QUANTDRIFT_KAFKA__BOOTSTRAP_SERVERS": fault_stack.bootstrap}
    gw = GatewayProcess.launch(EXAMPLE_CONFIG, tmp_path_factory.mktemp("oversized"), env)
    try:
        yield gw.wait_up()
    finally:
        gw.stop()


@pytest.fixture(scope="module", params=["idle", "every_core_busy"])
def load(request: pytest.FixtureRequest) -> Iterator[str]:
    """Nothing, or one busy loop per core at the test's own priority, for the module's cases."""
    if request.param == "idle":
        yield request.param
        return
    procs = [
        subprocess.Popen([sys.executable, "-c", BUSY, str(BUSY_MAX_S)])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        time.sleep(0.2)
        assert all(p.poll() is None for p in procs), "a busy loop did not start"
        yield request.param
        spent = [psutil.Process(p.pid).cpu_times().user for p in procs]
        assert all(s > 0 for s in spent), f"busy loops did not run: {spent}"
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def body(mb: int) -> bytes:
    content = b"x" * (mb * MB)
    return (
        b'{"model": "'
        + ROUTE.encode()
        + b'", "messages": [{"role": "user", "content": "'
        + content
        + b'"}]}'
    )


def refused(gateway: GatewayProcess) -> float:
    return gateway.metric(TOO_LARGE, outcome="too_large")


def assert_413(status: int, raw: bytes) -> None:
    assert status == 413, raw[:300]
    error = orjson.loads(raw)["error"]
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("mb", SIZES)
def test_the_openai_sdk_reads_the_413_with_one_upload(
    gateway: GatewayProcess, load: str, mb: int
) -> None:
    """The SDK retries connection errors twice: a reset would be three uploads."""
    sent: list[str] = []
    transport = httpx.Client(event_hooks={"request": [lambda r: sent.append(r.url.path)]})
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", http_client=transport)
    before = refused(gateway)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model=ROUTE, messages=[{"role": "user", "content": "x" * (mb * MB)}]
        )
    assert caught.value.status_code == 413, caught.value
    assert caught.value.code == "request_too_large"
    assert sent == ["/v1/chat/completions"], f"{load}: the SDK sent {len(sent)} uploads"
    uploads = refused(gateway) - before
    assert uploads == 1, f"{load}: the gateway counted {uploads} refused uploads"


@pytest.mark.parametrize("mb", SIZES)
def test_http_client_reads_the_413(gateway: GatewayProcess, load: str, mb: int) -> None:
    before = refused(gateway)
    conn = http.client.HTTPConnection(gateway.host, gateway.port, timeout=30)
    try:
        conn.request("POST", "/v1/chat/completions", body(mb), {"content-type": "application/json"})
        resp = conn.getresponse()
        assert_413(resp.status, resp.read())
        assert resp.getheader("connection") == "close"
    finally:
        conn.close()
    assert refused(gateway) - before == 1


@pytest.mark.parametrize("mb", SIZES)
def test_urllib_reads_the_413(gateway: GatewayProcess, load: str, mb: int) -> None:
    """urllib says ``Connection: close``: the case that got a reset on a loaded machine."""
    before = refused(gateway)
    req = urllib.request.Request(
        f"{gateway.url}/v1/chat/completions",
        data=body(mb),
        headers={"content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(req, timeout=30)
    assert_413(caught.value.code, caught.value.read())
    assert refused(gateway) - before == 1


# Every framing at 100 MB; at 20 MB the case that used to reset (a declared length, close).
SLOW_CASES = [
    (100, "content-length/close"),
    (100, "content-length/keep-alive"),
    (100, "chunked/close"),
    (20, "content-length/close"),
]


@pytest.mark.parametrize(("mb", "framing"), SLOW_CASES)
def test_a_sender_still_sending_after_the_answer_reads_it(
    gateway: GatewayProcess, load: str, mb: int, framing: str
) -> None:
    """The answer arrives first; the rest of the body goes after it, paced; then the 413 is read.

    With a declared length the gateway answers on the headers; chunked, once it has
    read ``max_body_bytes``. Either way the client has most of its body left to send
    when the answer is already in its socket, and every later send must succeed.
    """
    length, connection = framing.split("/")
    payload = body(mb)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {gateway.host}\r\n"
        f"Content-Type: application/json\r\nConnection: {connection}\r\n"
    )
    head += (
        f"Content-Length: {len(payload)}\r\n\r\n"
        if length == "content-length"
        else "Transfer-Encoding: chunked\r\n\r\n"
    )
    lingered = gateway.metric("quantdrift_gateway_lingering_closes_total", end="eof")
    before = refused(gateway)
    piece = MB
    with socket.create_connection((gateway.host, gateway.port), timeout=30) as sock:
        sock.sendall(head.encode())
        offset = 0
        # Send until the answer is readable: the first MiB (declared), or 8 MiB and more.
        answered_at = None
        while offset < len(payload):
            sock.sendall(frame(payload[offset : offset + piece], length))
            offset += piece
            if select.select([sock], [], [], 0.0 if offset < 12 * MB else 10.0)[0]:
                answered_at = offset
                break
        assert answered_at is not None, "no answer while the body was being sent"
        assert answered_at < len(payload) - 4 * MB, f"answered only at {answered_at} bytes"
        # The rest of the body, paced: a slow client still sending after the answer.
        while offset < len(payload):
            sock.sendall(frame(payload[offset : offset + piece], length))
            offset += piece
            time.sleep(0.002)
        if length == "chunked":
            sock.sendall(b"0\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        raw = read_all(sock)
    head_raw, _, answer = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head_raw.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    assert_413(int(status_line.split()[1]), answer)
    assert headers.get("connection") == "close", headers
    assert refused(gateway) - before == 1
    # The gateway read the rest to the client's end (eof), not a bound.
    deadline = time.monotonic() + 5
    while gateway.metric("quantdrift_gateway_lingering_closes_total", end="eof") == lingered:
        assert time.monotonic() < deadline, "the gateway did not count its lingering close"
        time.sleep(0.05)


def frame(data: bytes, length: str) -> bytes:
    return data if length == "content-length" else b"%x\r\n%s\r\n" % (len(data), data)


def read_all(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes; a reset here fails the test."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_client_that_goes_quiet_mid_body_is_cut_after_the_idle_bound(
    gateway: GatewayProcess,
) -> None:
    """The linger is bounded: a client that stops sending is closed ``IDLE_S`` later."""
    quiet = "quantdrift_gateway_lingering_closes_total"
    idle = gateway.metric(quiet, end="idle")
    with socket.create_connection((gateway.host, gateway.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"
        )
        sock.sendall(b"{" + b" " * MB)
        raw = read_all(sock)  # the answer, then the end of the gateway's side
        answered = time.monotonic()
        assert raw.startswith(b"HTTP/1.1 413"), raw[:200]
        while gateway.metric(quiet, end="idle") == idle:
            assert time.monotonic() - answered < IDLE_S + 10, "the linger was never cut"
            time.sleep(0.1)
        took = time.monotonic() - answered
    assert took >= IDLE_S - 1.0, f"cut after {took:.1f}s, before the idle bound"
