"""The follower: signed RouteCommands applied to a gateway quantdrift does not own (nginx).

``quantdrift follow nginx`` runs the gateway's own ``RouteController`` (the control
topic, the Redis route keys as backstop, and one gate for both: signature, epoch,
freshness, a target this config can map) and, after each command it applies,
rewrites one file that the operator's nginx config includes, then reloads nginx
gracefully (``nginx -s reload``: new workers take the new upstreams, old ones finish
the requests they hold). Each switch is logged with its time: from the command's
``issued_at`` to the reload done, and the reload itself.

The file holds one ``upstream`` block per route of the gateway config, named
``quantdrift_<route>`` (``--upstream ROUTE=NAME`` to choose), listing the servers of the
pool the route serves now. ``routing.route_shares`` says which: the gateway's rules
for a whole route (a canary splits by server weight). The servers are the pools'
``host:port``; the path of a pool URL is nginx's own ``proxy_pass`` business, so the
pools of one route must share it (a config where they do not is refused).

What it never does: write before every route's latest command is known (until then
nginx keeps the file it has: the follower does not own serving), or leave a failed
reload unsaid. A reload that fails is logged, counted and tried again every second
until nginx takes the file, because a rollback nginx did not load is not a rollback.
The pure part (``upstream_file``) is apart from the I/O (``NginxFollower``). It sits
beside the collector rather than in ``control/``: it reads routing's rules
(``route_shares``), and control imports nothing of the serving side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from quantdrift.errors import ConfigError
from quantdrift.gateway.chain.routing import RouteDirective, route_shares
from quantdrift.gateway.control.controller import RouteController
from quantdrift.gateway.gateway_config import GatewayConfig
from quantdrift.schemas.command import RouteCommand
from quantdrift.supervision import Supervisor

log = logging.getLogger(__name__)

HEADER = "# Written by `quantdrift follow nginx`: rewritten on every route command; do not edit.\n"
WEIGHT_SCALE = 10  # server weight per percent: 0.1 % steps
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def upstream_name(route: str) -> str:
    """The default upstream name of a route.

    >>> upstream_name("cs-agent/int4")
    'quantdrift_cs-agent_int4'
    """
    return "quantdrift_" + re.sub(r"[^A-Za-z0-9_.-]", "_", route)


def pool_servers(config: GatewayConfig) -> dict[str, list[str]]:
    """Each pool's ``host:port`` servers; ConfigError when a route's pools differ in path.

    >>> from quantdrift.gateway.gateway_config import parse_config
    >>> pool_servers(parse_config({"precisions": {"a": ["http://h:1/v"], "b": ["http://g/v"]},
    ...                            "routes": {"r": {"candidate": "a", "reference": "b"}}}))
    {'a': ['h:1'], 'b': ['g:80']}
    """
    servers, paths = {}, {}
    for pool, urls in config.precisions.items():
        parts = [urlsplit(u) for u in urls]
        if any(p.scheme != "http" for p in parts):
            raise ConfigError(f"precisions.{pool}: the nginx follower writes http upstreams only")
        servers[pool] = [f"{p.hostname}:{p.port or 80}" for p in parts]
        paths[pool] = {p.path.rstrip("/") for p in parts}
    for route, rc in config.routes.items():
        if len(paths[rc.candidate] | paths[rc.reference]) > 1:
            raise ConfigError(
                f"routes.{route}: its pools' URLs differ in path "
                f"({sorted(paths[rc.candidate] | paths[rc.reference])}); an nginx upstream "
                "names host:port only, so the path must be one, in nginx's proxy_pass"
            )
    return servers


def upstream_file(
    config: GatewayConfig,
    directives: Mapping[str, RouteDirective | None],
    names: Mapping[str, str],
    servers: Mapping[str, list[str]],
    notes: Mapping[str, str] | None = None,
) -> str:
    """The included file: one ``upstream`` block per route, its servers the pools it
    serves now, weighted by their share. Pure: the same commands give the same bytes.

    >>> from quantdrift.gateway.gateway_config import parse_config
    >>> cfg = parse_config({"precisions": {"int4": ["http://a:1"], "bf16": ["http://b:2"]},
    ...                     "routes": {"r": {"candidate": "int4", "reference": "bf16"}}})
    >>> text = upstream_file(cfg, {"r": RouteDirective("canary", "int4", 5.0)},
    ...                      {"r": "up_r"}, pool_servers(cfg))
    >>> print(text.split("\\n", 1)[1], end="")
    # route r: int4 5.0 %, bf16 95.0 %
    upstream up_r {
        server a:1 weight=50;
        server b:2 weight=950;
    }
    """
    blocks = [HEADER]
    for route, rc in config.routes.items():
        shares = route_shares(
            candidate=rc.candidate, reference=rc.reference, directive=directives.get(route)
        )
        split = ", ".join(f"{pool} {share:.1f} %" for pool, share in shares.items())
        note = f" ({notes[route]})" if notes and route in notes else ""
        lines = [f"# route {route}: {split}{note}", f"upstream {names[route]} {{"]
        for pool, share in shares.items():
            for server in servers[pool]:
                if len(shares) == 1:
                    lines.append(f"    server {server};")
                else:
                    weight = max(1, round(share * WEIGHT_SCALE / len(servers[pool])))
                    lines.append(f"    server {server} weight={weight};")
        lines.append("}")
        blocks.append("\n".join(lines) + "\n")
    return "".join(blocks)


@dataclass(frozen=True, slots=True)
class Switch:
    """One applied command, as the follower timed it (wall-clock seconds)."""

    route: str
    action: str
    epoch: int
    issued_at: float
    reloaded_at: float
    reload_s: float

    @property
    def since_issued_s(self) -> float:
        return self.reloaded_at - self.issued_at


class NginxFollower:
    """Write the upstream file and reload nginx after every command the controller applies."""

    def __init__(
        self,
        config: GatewayConfig,
        controller: RouteController,
        upstream_path: Path,
        reload_cmd: Sequence[str],
        *,
        names: Mapping[str, str] | None = None,
        reload_timeout_s: float = 10.0,
        retry_s: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        unknown = sorted(set(names or {}) - set(config.routes))
        if unknown:
            raise ConfigError(f"--upstream names unknown routes: {', '.join(unknown)}")
        self.names = {r: (names or {}).get(r) or upstream_name(r) for r in config.routes}
        for name in self.names.values():
            if not _NAME.match(name):
                raise ConfigError(f"upstream name {name!r}: letters, digits, _ . - only")
        if not reload_cmd:
            raise ConfigError("--reload-cmd is empty")
        self.config = config
        self.controller = controller
        self.path = upstream_path
        self.reload_cmd = list(reload_cmd)
        self.reload_timeout_s = reload_timeout_s
        self.retry_s = retry_s
        self._wall = wall_clock
        self.servers = pool_servers(config)
        self.switches: list[Switch] = []
        self.reload_failures = 0
        self._pending = False  # a written file nginx has not taken yet
        self._lock = asyncio.Lock()
        self._retry: asyncio.Task[None] | None = None
        self.supervisor = Supervisor()

    # -- the file ----------------------------------------------------------------------

    def render(self) -> str:
        directives: dict[str, RouteDirective | None] = {}
        notes: dict[str, str] = {}
        for route in self.config.routes:
            applied = self.controller.state(route)
            if applied is None:
                directives[route] = None
                continue
            directives[route] = RouteDirective(
                applied.action, applied.target_precision, applied.percent
            )
            notes[route] = f"{applied.action}, epoch {applied.epoch}"
        return upstream_file(self.config, directives, self.names, self.servers, notes)

    def write(self) -> bool:
        """Write the file atomically when its bytes change; True if they did."""
        text = self.render()
        with contextlib.suppress(FileNotFoundError):
            if self.path.read_text() == text:
                return False
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)
        return True

    # -- reloads -------------------------------------------------------------------------

    async def reload(self) -> float:
        """Run the reload command; its duration in seconds. Raises RuntimeError on failure."""
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self.reload_cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            async with asyncio.timeout(self.reload_timeout_s):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"reload took over {self.reload_timeout_s:.0f} s") from None
        if proc.returncode != 0:
            said = out.decode("utf-8", "replace").strip()[-500:]
            raise RuntimeError(f"reload exited {proc.returncode}: {said}")
        return time.monotonic() - t0

    async def apply(self, command: RouteCommand | None) -> Switch | None:
        """Write the file for the routes' current commands and reload nginx if it changed."""
        async with self._lock:
            if not self.write() and not self._pending:
                return None
            self._pending = True
            try:
                took = await self.reload()
            except (RuntimeError, OSError) as exc:
                self.reload_failures += 1
                log.error(
                    "nginx reload failed (%d so far), retrying every %.0f s: %s; "
                    "%s is written, nginx still serves the previous upstreams",
                    self.reload_failures,
                    self.retry_s,
                    exc,
                    self.path,
                )
                self._schedule_retry()
                return None
            self._pending = False
        if command is None:
            log.info("nginx upstreams written to %s and reloaded in %.0f ms", self.path, took * 1e3)
            return None
        now = self._wall()
        switch = Switch(command.route, command.action, command.epoch, command.issued_at, now, took)
        self.switches.append(switch)
        log.info(
            "route %s: %s (epoch %d) -> nginx upstream %s rewritten and reloaded in %.0f ms, "
            "%.0f ms after the command was issued",
            switch.route,
            switch.action,
            switch.epoch,
            self.names[command.route],
            took * 1e3,
            switch.since_issued_s * 1e3,
        )
        return switch

    def _schedule_retry(self) -> None:
        if self._retry is None or self._retry.done():
            self._retry = self.supervisor.spawn("nginx-reload-retry", self._retry_loop)

    async def _retry_loop(self) -> None:
        while self._pending:
            await asyncio.sleep(self.retry_s)
            async with self._lock:
                if not self._pending:
                    return
                try:
                    took = await self.reload()
                except (RuntimeError, OSError) as exc:
                    self.reload_failures += 1
                    if self.reload_failures % 10 == 0:
                        log.error("nginx reload still failing (%d): %s", self.reload_failures, exc)
                    continue
                self._pending = False
                log.warning(
                    "nginx reload succeeded after %d failures (%.0f ms)",
                    self.reload_failures,
                    took * 1e3,
                )

    # -- lifecycle -------------------------------------------------------------------------

    async def _changed(self, _route: str, command: RouteCommand) -> None:
        await self.apply(command)

    async def start(self, known_within_s: float = 30.0) -> None:
        """Follow commands; once every route's latest is known, bring the file up to date."""
        self.controller.supervisor = self.supervisor
        for route in self.config.routes:
            self.controller.watch(route)
        await self.controller.start()
        if not await self.controller.wait_known(known_within_s):
            log.warning(
                "route commands not known after %.0f s (Redis and the control topic "
                "unreachable?): %s left as it is until they are",
                known_within_s,
                self.path,
            )
            await self.controller.wait_known(float("inf"))
        self.controller.on_change(self._changed)
        await self.apply(None)
        log.info(
            "following %d routes into %s (reload: %s)",
            len(self.names),
            self.path,
            shlex.join(self.reload_cmd),
        )

    async def write_once(self, known_within_s: float = 30.0) -> None:
        """Write the file from the routes' latest commands and stop (before nginx starts)."""
        await self.controller.start()
        try:
            if not await self.controller.wait_known(known_within_s):
                raise ConfigError(
                    f"route commands not known within {known_within_s:.0f} s: "
                    "are Redis and the broker reachable?"
                )
            self.write()
        finally:
            await self.controller.stop()

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
        await self.controller.stop()


def reload_argv(command: str) -> list[str]:
    """``--reload-cmd`` split like a shell would, without a shell.

    >>> reload_argv("nginx -p '/srv/my nginx' -s reload")
    ['nginx', '-p', '/srv/my nginx', '-s', 'reload']
    """
    return shlex.split(command)
