"""Fixtures: an API server in process (real uvicorn, real SQLite store) with a
few static tokens (make_api, api); and the store of the session's real
`hvfleet serve` (tests/conftest.py `server`) reset to a small fleet (store)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hvfleet.server.app import create_app
from hvfleet.server.context import Limits
from hvfleet.server.identity import Identity
from hvfleet.store import Store, open_store
from tests.server.clients import Kubectl
from tests.server.running import Api, ServerThread, stop_in_background
from tests.server.static_auth import AllowAll, RecordingAudit, StaticTokens
from tests.server.tls_files import make_tls_files
from tests.support.kubectl import KUBECTLS
from tests.support.serve import Server, reset_fleet

TOKENS = {
    "ops-token": Identity("ops", "operator", token_id="t-ops"),
    "ops2-token": Identity("ops2", "operator", token_id="t-ops2"),
    "sched-token": Identity("scheduler", "scheduler", token_id="t-sched"),
    "viewer-token": Identity("viewer", "viewer", token_id="t-viewer"),
    "agent-hv1-token": Identity("agent/hv1", "agent", hypervisor="hv1", token_id="t-agent-hv1"),
}


@pytest.fixture
def make_api(tmp_path: Path) -> Iterator[Callable[..., Api]]:
    started: list[tuple[ServerThread, Store]] = []

    def make(limits: Limits | None = None, store_url: str | None = None, tls: bool = False,
             authorizer: AllowAll | None = None, audit: RecordingAudit | None = None) -> Api:
        store = open_store(store_url or f"sqlite:///{tmp_path}/hvfleet.db")
        authorizer = authorizer or AllowAll()
        app = create_app(store, StaticTokens(TOKENS), authorizer, audit=audit, limits=limits,
                         dashboard_pages=False)  # the API alone; tests/dashboard serve both
        files = make_tls_files(tmp_path / f"tls-{len(started)}") if tls else None
        server = ServerThread(app, files).__enter__()
        started.append((server, store))
        return Api(server.url, store, authorizer, server, files.ca if files else None)

    yield make

    def close_stores() -> None:
        for _, store in started:
            store.close()

    stop_in_background([server for server, _ in started], close_stores)


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()


@pytest.fixture
def store(server: Server) -> Iterator[Store]:
    """The `server` fixture's store with hv1 and hv2 (live, with status) and
    reservation r1 on hv1, as every test here that writes over HTTPS starts."""
    with open_store(server.store_url) as s:
        reset_fleet(s)
        yield s


@pytest.fixture(params=sorted(KUBECTLS))
def kubectl(request: pytest.FixtureRequest, make_api: Callable[..., Api], tmp_path: Path) -> Kubectl:
    binary = KUBECTLS[request.param]
    assert os.access(binary, os.X_OK), f"{binary} missing: run scripts/install-system-deps / pip install"
    return Kubectl(binary, request.param, make_api(tls=True), tmp_path)
