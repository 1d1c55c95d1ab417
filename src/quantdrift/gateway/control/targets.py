"""Map a RouteCommand's target onto this gateway's pools: the one place it happens.

Commands name the side users go to by role (``candidate`` / ``reference``), so a
breaker needs to know nothing of any gateway's pool names. Each gateway maps the
role through its own route config (``routes.R.candidate`` / ``.reference``). A
command may also carry the concrete precision its policy names; a gateway whose
mapping disagrees refuses the command rather than guessing (never both by
accident). A command that cannot be mapped is refused and counted by the
controller, and the route keeps serving what it served: never a 5xx.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from quantdrift.errors import UnmappableCommand
from quantdrift.gateway.gateway_config import GatewayConfig, RouteConfig
from quantdrift.schemas.command import RouteCommand

Resolver = Callable[[RouteCommand], str]


def resolve_target(command: RouteCommand, routes: Mapping[str, RouteConfig]) -> str:
    """The pool users of ``command.route`` go to, or UnmappableCommand.

    >>> from quantdrift.gateway.gateway_config import RouteConfig
    >>> cmd = RouteCommand(command_id="r#1", route="r", action="rollback", target="reference",
    ...                    epoch=1, issued_at=0.0)
    >>> resolve_target(cmd, {"r": RouteConfig(candidate="int4", reference="bf16")})
    'bf16'
    """
    config = routes.get(command.route)
    if config is None:
        raise UnmappableCommand(f"command {command.command_id}: route {command.route!r} unknown")
    pool = config.reference if command.target == "reference" else config.candidate
    hint = command.target_precision
    if hint is not None and hint != pool:
        raise UnmappableCommand(
            f"command {command.command_id}: target {command.target} is {pool!r} here, "
            f"but the command names {hint!r}"
        )
    return pool


def resolver_for(config: GatewayConfig) -> Resolver:
    """The resolver a RouteController uses for a gateway's config."""
    routes = dict(config.routes)
    return lambda command: resolve_target(command, routes)
