"""The store fixture: every contract test runs against every backend.

Backends are listed in STORE_BACKENDS; each entry is a factory that starts
what the backend needs (a file, a real etcd) and yields a URL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hvfleet.store import Store, open_store


@contextmanager
def sqlite_backend(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path}/hvfleet.db"


STORE_BACKENDS: dict[str, Callable[[Path], object]] = {"sqlite": sqlite_backend}


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    factory = STORE_BACKENDS[request.param]
    with factory(tmp_path) as url:  # type: ignore[attr-defined]
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url)
    try:
        yield s
    finally:
        s.close()
