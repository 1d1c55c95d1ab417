"""``quantdrift follow nginx`` and slice-scoped commands: refused, logged, and the
route's whole rollback still moves nginx.

nginx splits a route by server weight; it cannot tell a request's language or length,
so the follower maps no slice (``services.gateway.build_controller(slices=False)``). A
slice-scoped rollback reaching it is refused at the gate (``unmappable_slice``) with
one error line naming the slice, and the upstream file is left as it was; the breaker
then widens to the route when the slice's failing pairs keep coming (``deciding.md``).
A whole-route rollback from the console after it still rewrites the file.

The follower runs as users run it (the command line, the embedded broker and Redis);
its reload command is ``true``: what is checked is the file nginx would load
(``test_nginx.py`` reloads a real nginx). The slice command is the breaker's own
(``support.slice_walk``), signed with the deployment's key and produced onto the
control topic as the outbox relay would.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from quantdrift.breaker.policy import RoutePolicy
from quantdrift.config import DEV_KEY
from quantdrift.demo.workers import settings_env
from quantdrift.schemas.signing import CommandSigner
from quantdrift.stack import EmbeddedStack
from quantdrift.stack.ports import stop_popen
from support.guard import isolated_settings, make_topics
from support.kafka import produce
from support.slice_walk import SliceWalk

pytestmark = [pytest.mark.timeout(180)]

ROUTE = "cs-agent/int4"
CANDIDATE, REFERENCE = "127.0.0.1:18001", "127.0.0.1:18002"  # never called: only written
POLICY = RoutePolicy(
    rollback_scope="slice", slice_dimensions=("language",), slice_min_pairs=5, min_pairs=5
)


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


async def test_the_nginx_follower_refuses_a_slice_rollback_and_keeps_whole_route_rollback(
    stack: EmbeddedStack, redis_prefix: str, tmp_path: Path
) -> None:
    settings = isolated_settings(stack, redis_prefix)
    await make_topics(settings)
    env = {**os.environ, **settings_env(settings, stack.redis_url), "OMP_NUM_THREADS": "1"}
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "precisions": {
                    "int4": [f"http://{CANDIDATE}/v"],
                    "bf16": [f"http://{REFERENCE}/v"],
                },
                "routes": {ROUTE: {"candidate": "int4", "reference": "bf16"}},
            },
            sort_keys=False,  # the candidate before the reference, as the config asks
        )
    )
    upstreams = tmp_path / "upstreams.conf"
    log = tmp_path / "follower.log"
    follow = ["follow", "nginx", "--config", str(config), "--upstream-file", str(upstreams)]
    follower = subprocess.Popen(
        [sys.executable, "-m", "quantdrift", *follow, "--reload-cmd", "true"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    try:
        wait_for(log, "following 1 routes", follower)
        first = upstreams.read_text()
        assert f"server {CANDIDATE};" in first and REFERENCE not in first

        # The breaker rolls back Chinese alone: one signed slice command on the topic.
        walk = SliceWalk(POLICY, route=ROUTE, now=time.time() - 5)
        await walk.until_command("zh")
        (command,) = walk.commands
        assert command.slice is not None and command.slice.key == "language=zh"
        sealed = CommandSigner("dev", DEV_KEY.encode()).seal(command)
        await produce(stack.bootstrap, settings.kafka.topics.control, [(ROUTE.encode(), sealed)])
        wait_for(log, "slice language=zh is on a tag this gateway does not compute", follower)
        line = next(x for x in log.read_text().splitlines() if "slice language=zh" in x)
        assert "refused kafka command (unmappable_slice, 1 so far), route keeps its target" in line
        assert f"command {command.command_id}" in line
        await asyncio.sleep(0.5)
        assert upstreams.read_text() == first  # nginx keeps serving the candidate

        # The whole route's rollback, from the console, still moves nginx.
        done = subprocess.run(
            [sys.executable, "-m", "quantdrift", "route", "rollback", "--route", ROUTE],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(log, f"route {ROUTE}: rollback", follower)
        after = upstreams.read_text()
        assert f"server {REFERENCE};" in after and CANDIDATE not in after
    finally:
        stop_popen(follower)
