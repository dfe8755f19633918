"""The store fixture: every contract test runs against every backend.

Backends are listed in STORE_BACKENDS; each entry is a factory that starts
what the backend needs (a file, a real etcd) and yields a URL. The etcd backend
shares one real single-member etcd per test session (tests/conftest.py
etcd_session: started on first use on 127.0.0.1 free ports, data in a temp dir,
stopped at the end); each test gets its own key prefix, so tests never see
each other's objects.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from hvfleet.store import Store, open_store
from hvfleet.store.etcd_local import EtcdCluster


@contextmanager
def sqlite_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path}/hvfleet.db"


@contextmanager
def etcd_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    cluster: EtcdCluster = request.getfixturevalue("etcd_session")
    yield cluster.url(prefix=f"/test-{uuid.uuid4().hex[:12]}")


STORE_BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], AbstractContextManager[str]]] = {
    "sqlite": sqlite_backend,
    "etcd": etcd_backend,
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
