"""Placement 16.0's own API tests (the 31 gabbi files that need only the plain
API fixture) against one `hvfleet serve` over HTTPS with a real admin token,
each file on a fresh set of Placement records (tests/placement/gabbi_runner.py).

Not every step passes yet: PASSING is the count per file this branch reaches,
a ratchet (a regression fails; an improvement fails too, until the number is
raised), and docs/placement.md lists what the misses are."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.store import Store, open_store
from hvfleet.store.tokens import issue_token
from tests.placement.gabbi_runner import plain_api_files, run_file
from tests.server.running import ServerThread
from tests.server.tls_files import make_tls_files

# Real Placement 16.0 through a plain WSGI server: 516 of these 535 steps.
PASSING = {
    "aggregate.yaml": 15, "allocation-bad-class.yaml": 7, "allocations-1-12.yaml": 10,
    "allocations-1-8.yaml": 3, "allocations-bug-1714072.yaml": 7, "allocations-bug-1778591.yaml": 5,
    "allocations-bug-1778743.yaml": 3, "allocations-bug-1779717.yaml": 8, "allocations-post.yaml": 27,
    "allocations.yaml": 37, "basic-http.yaml": 16, "bug-1674694.yaml": 0, "confirm-auth.yaml": 3,
    "inventory.yaml": 47, "microversion-bug-1724065.yaml": 1, "microversion.yaml": 7,
    "non-cors.yaml": 2, "resource-class-in-use.yaml": 10, "resource-classes-1-6.yaml": 0,
    "resource-classes-1-7.yaml": 2, "resource-classes-last-modified.yaml": 9,
    "resource-classes.yaml": 13, "resource-provider-aggregates.yaml": 30,
    "resource-provider-bug-1779818.yaml": 9, "resource-provider-duplication.yaml": 4,
    "resource-provider-links.yaml": 1, "resource-provider.yaml": 64, "shared-resources.yaml": 13,
    "traits.yaml": 43, "unicode.yaml": 5, "usage.yaml": 10,
}


class Served:
    def __init__(self, store: Store, port: int, token: str) -> None:
        self.store, self.port, self.token = store, port, token


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    d = Path(tempfile.mkdtemp())
    store = open_store(f"sqlite:///{d}/hvfleet.db")
    _, token = issue_token(store, "admin", manager="test", now=datetime.now(UTC), ttl=None, name="gabbi")
    app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
    with ServerThread(app, make_tls_files(d / "tls")) as server:
        yield Served(store, server.port, token)
    store.close()


def test_the_plain_api_fixture_files_are_the_31_of_placement_16() -> None:
    assert sorted(p.name for p in plain_api_files()) == sorted(PASSING)


@pytest.mark.slow
@pytest.mark.parametrize("path", plain_api_files(), ids=lambda p: p.stem)
def test_placement_gabbi_file_passes_its_steps(served: Served, path: Path) -> None:
    result = run_file(path, "127.0.0.1", served.port, served.token, served.store)
    detail = "\n".join(result.failures)
    assert result.passed == PASSING[path.name], f"{result.passed}/{result.steps} passed\n{detail}"
