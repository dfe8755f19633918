"""The Placement edge asks `policy.allowed_by_role` on the event loop and
calls `policy.authorize` (in a thread) only when that says no: the two must
decide alike wherever no provider lookup is needed. It authenticates on the
loop only where that needs no store read."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest
from starlette.requests import Request

from hvfleet.placement.errors import PlacementForbidden
from hvfleet.server.auth import TokenAuthenticator
from hvfleet.server.identity import Identity
from hvfleet.server.placement import policy
from hvfleet.server.placement.edge import Call
from hvfleet.store import open_store
from hvfleet.store.tokens import issue_token
from tests.placement.support import _serve

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


def test_a_token_not_yet_cached_is_looked_up_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Placement edge authenticates as the Kubernetes API's guard does: a
    token whose record is cached is checked on the loop, one that needs the
    store read (on etcd, a round trip) in a worker thread, never blocking
    every other request of the server meanwhile."""
    looked_up: list[bool] = []  # whether each store-reading lookup ran on an event loop
    real = TokenAuthenticator.authenticate

    def recording(self: TokenAuthenticator, authorization: str | None) -> Identity:
        try:
            asyncio.get_running_loop()
            looked_up.append(True)
        except RuntimeError:
            looked_up.append(False)
        return real(self, authorization)

    monkeypatch.setattr(TokenAuthenticator, "authenticate", recording)
    store = open_store(f"sqlite:///{tmp_path}/hvfleet.db")
    served = _serve(store, tmp_path)
    api = next(served)
    try:
        _, api.tokens["fresh"] = issue_token(store, "viewer", manager="test", now=datetime.now(UTC), ttl=None,
                                             name="t-fresh")
        for _ in range(2):  # the first looks the record up; the second finds it cached
            assert api.call("GET", "/usages?project_id=p", role="fresh").status_code == 200
        api.tokens["unknown"] = "hvf_unknown.secret"
        assert api.call("GET", "/usages?project_id=p", role="unknown").status_code == 401
        assert looked_up and not any(looked_up), looked_up
    finally:
        served.close()
        store.close()
