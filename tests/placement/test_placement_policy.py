"""The Placement edge asks `policy.allowed_by_role` on the event loop and
calls `policy.authorize` (in a thread) only when that says no: the two must
decide alike wherever no provider lookup is needed."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from hvfleet.placement.errors import PlacementForbidden
from hvfleet.server.identity import Identity
from hvfleet.server.placement import policy
from hvfleet.server.placement.edge import Call

RULES = ["open", "authenticated", "read", "names", "candidates", "allocations", "providers",
         "inventories", "traits", "aggregates", "resource_classes", "trait_names", "reshaper"]
ROLES = ["viewer", "operator", "scheduler", "agent", "admin"]


def _call(who: Identity) -> Call:
    # A request with no `uuid` in its path: an agent's own-tree rule has no provider to look up.
    request = Request({"type": "http", "method": "GET", "path": "/traits", "headers": [],
                       "query_string": b"", "path_params": {}})
    return Call(request, (1, 39), who, None, {})  # type: ignore[arg-type]  # the store is never read here


@pytest.mark.parametrize("role", ROLES)
def test_the_role_table_asked_on_the_loop_decides_as_authorize_does(role: str) -> None:
    who = Identity(subject=f"t-{role}", role=role,  # type: ignore[arg-type]
                   hypervisor="compute-01" if role == "agent" else None)
    for rule in RULES:
        allowed = policy.allowed_by_role(who, rule)
        try:
            policy.authorize(_call(who), rule)
            authorized = True
        except PlacementForbidden:
            authorized = False
        assert allowed == authorized, (role, rule)
        assert allowed == (rule in ("open", "authenticated") or rule in policy.ROLE_RULES[role])
    # What an agent may do on its own tree is never decided on the loop (it needs the lookup).
    assert not any(policy.allowed_by_role(Identity("agent/x", "agent", "x"), r) for r in policy.AGENT_OWN)
