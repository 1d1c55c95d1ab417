"""Where the LiteLLM guard sends one call: the candidate group, or the reference. Pure.

The guard follows signed RouteCommands with the gateway's own ``RouteController`` and
holds slices apart as a gateway does: a call whose slice tags (computed from the call
by the gateway's one function, ``gateway/slices.request_tags``) fall in a slice held by
a slice-scoped rollback goes to the reference (rolled back or half-open), the rest by
the route's own command. LiteLLM mirrors a call to its ``silent_model`` (the reference)
whatever the guard does, so a rewritten call is simply served by the reference group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantdrift.gateway.chain.planning import json_spec
from quantdrift.gateway.chain.slices import request_tags
from quantdrift.gateway.control.fence import AppliedCommand


def call_tags(data: Mapping[str, Any], task: str | None) -> dict[str, str]:
    """A LiteLLM call's slice tags, as the gateway computes them for its requests."""
    return request_tags(data, expects_json=json_spec(data) is not None, task=task)


def serves_reference(applied: AppliedCommand | None, tags: Mapping[str, str], draw: float) -> bool:
    """Whether this call goes to the reference; ``draw`` is uniform in [0, 1) (a canary's
    share). No command yet: the candidate, as a gateway before its first command.

    >>> serves_reference(None, {"language": "zh"}, 0.5)
    False
    """
    if applied is None:
        return False
    if applied.slice_of(tags) is not None:
        return True  # held apart: rolled back, or half-open (the reference serves it)
    command = applied.command
    if command.slice is not None:
        return False  # a slice's command: the rest of the route is on its candidate
    if command.action == "canary" and command.percent:
        return draw * 100 >= command.percent
    return not command.users_on_candidate
