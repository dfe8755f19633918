"""The store fixture: every contract test runs against every backend.

Backends are listed in STORE_BACKENDS; each entry is a factory that starts
what the backend needs (a file, a real etcd, a real API server) and yields a
URL. The etcd backend shares one real single-member etcd per test session
(tests/conftest.py etcd_session: started on first use on 127.0.0.1 free ports,
data in a temp dir, stopped at the end); each test gets its own key prefix, so
tests never see each other's objects. The remote backend starts, per test, the
API app of `hvfleet serve` (create_app with the real token authenticator and
role authorizer) under uvicorn in a thread, over TLS with a certificate from
the server's own CA (hvfleet.server.tls), over a fresh SQLite store, and a
real admin token from the token book; the remote store impersonates each
manager the tests write as (`?impersonate=true`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.support.etcd_local import EtcdCluster

from hvfleet.server.tls import ServingFiles
from hvfleet.store import Store, open_store


@contextmanager
def sqlite_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path}/hvfleet.db"


@contextmanager
def etcd_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    cluster: EtcdCluster = request.getfixturevalue("etcd_session")
    yield cluster.url(prefix=f"/test-{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def serving_files(tmp_path_factory: pytest.TempPathFactory) -> ServingFiles:
    """The CA and serving certificate `hvfleet serve` makes for 127.0.0.1."""
    from hvfleet.server.tls import ensure_serving_certificate

    return ensure_serving_certificate(tmp_path_factory.mktemp("serve-data"), "127.0.0.1")


@contextmanager
def remote_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    from tests.server.running import ServerThread, stop_in_background
    from tests.server.tls_files import TlsFiles

    from hvfleet.server.app import create_app
    from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
    from hvfleet.server.context import Limits
    from hvfleet.server.watch import WatchLimits
    from hvfleet.store.tokens import issue_token

    files: ServingFiles = request.getfixturevalue("serving_files")
    assert files.ca is not None
    behind = open_store(f"sqlite:///{tmp_path}/server.db")
    _, token = issue_token(behind, "admin", manager="test-setup", now=datetime.now(UTC),
                           ttl=timedelta(hours=2), name="contract-admin")
    # Concurrent tests open more watches than a person would with one token.
    app = create_app(behind, TokenAuthenticator(behind), RoleAuthorizer(),
                     limits=Limits(watch=WatchLimits(per_token=256)), dashboard_pages=False)
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("HVFLEET_TOKEN", token)
    monkeypatch.setenv("HVFLEET_CA", str(files.ca))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    server: ServerThread | None = None
    try:
        server = ServerThread(app, TlsFiles(files.ca, files.cert, files.key)).__enter__()
        yield f"{server.url}?impersonate=true"
    finally:
        if server is None:
            behind.close()
        else:  # without waiting out uvicorn's shutdown sleeps (tests/server/running.py)
            stop_in_background([server], behind.close)


STORE_BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], AbstractContextManager[str]]] = {
    "sqlite": sqlite_backend,
    "etcd": etcd_backend,
    "remote": remote_backend,
}


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    factory = STORE_BACKENDS[request.param]
    with factory(request, tmp_path) as url:
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def poison_store(store_url: str, tmp_path: Path) -> Callable[..., int]:
    """Put a document straight into the backend behind `store` (the remote
    backend's: its server's SQLite file), bypassing every check; returns the
    revision it was stored at (tests/store/poison.py)."""
    from tests.store.poison import poison

    behind = f"sqlite:///{tmp_path}/server.db" if store_url.startswith("https://") else store_url

    def put(kind: str, name: str, doc: Any) -> int:
        return poison(behind, kind, name, doc)

    return put
