"""Placement 16.0's own API tests (the 31 gabbi files that need only the plain
API fixture) against one `hvfleet serve` over HTTPS with a real admin token,
each file on a fresh set of Placement records (tests/placement/gabbi_runner.py),
with the Placement API at the root of its listener (`--placement-listen`:
the server's ASGI app dispatching by listener, as `hvfleet serve` runs it),
where the files expect Placement.

All 535 steps pass. PASSING is the count per file, held exactly (a
regression fails; so does an improvement, until the number is raised). The
server runs with `hvfleet serve`'s own HTTP protocol (server/connection.py),
which hands a head with a Content-Length that is not a number to the app
rather than answering uvicorn's plain 400; the runner sends that step
(basic-http's "bad content length not int", which httpx refuses to send)
over http.client (gabbi_runner.AsAsked).
The `/placement` mount's links are tested in test_placement_listener.py."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.server.connection import http_protocol
from hvfleet.server.placement import ByListener
from hvfleet.store import Store, open_store
from tests.placement.gabbi_runner import Tokens, issue_tokens, plain_api_files, run_file
from tests.server.running import ServerThread
from tests.server.tls_files import make_tls_files

# Real Placement 16.0 through a plain WSGI server: 516 of these 535 steps.
PASSING = {
    "aggregate.yaml": 19, "allocation-bad-class.yaml": 7, "allocations-1-12.yaml": 10,
    "allocations-1-8.yaml": 10, "allocations-bug-1714072.yaml": 7,
    "allocations-bug-1778591.yaml": 5, "allocations-bug-1778743.yaml": 5,
    "allocations-bug-1779717.yaml": 8, "allocations-post.yaml": 29, "allocations.yaml": 45,
    "basic-http.yaml": 24, "bug-1674694.yaml": 3, "confirm-auth.yaml": 4, "inventory.yaml": 64,
    "microversion-bug-1724065.yaml": 1, "microversion.yaml": 8, "non-cors.yaml": 2,
    "resource-class-in-use.yaml": 10, "resource-classes-1-6.yaml": 1,
    "resource-classes-1-7.yaml": 6, "resource-classes-last-modified.yaml": 10,
    "resource-classes.yaml": 30, "resource-provider-aggregates.yaml": 34,
    "resource-provider-bug-1779818.yaml": 9, "resource-provider-duplication.yaml": 4,
    "resource-provider-links.yaml": 8, "resource-provider.yaml": 83, "shared-resources.yaml": 16,
    "traits.yaml": 53, "unicode.yaml": 5, "usage.yaml": 15,
}


class Served:
    def __init__(self, store: Store, port: int, token: Tokens) -> None:
        self.store, self.port, self.token = store, port, token


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    d = Path(tempfile.mkdtemp())
    store = open_store(f"sqlite:///{d}/hvfleet.db")
    token = issue_tokens(store)
    app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
    listeners = ByListener(app, placement_port=0)
    with ServerThread(listeners, make_tls_files(d / "tls"), http=http_protocol()) as server:
        listeners.placement_port = server.port  # this listener is the Placement one
        yield Served(store, server.port, token)
    store.close()


def test_the_plain_api_fixture_files_are_the_31_of_placement_16() -> None:
    assert sorted(p.name for p in plain_api_files()) == sorted(PASSING)


@pytest.mark.slow
@pytest.mark.parametrize("path", plain_api_files(), ids=lambda p: p.stem)
def test_placement_gabbi_file_passes_its_steps(served: Served, path: Path) -> None:
    result = run_file(path, "127.0.0.1", served.port, served.token, served.store, prefix="")
    detail = "\n".join(result.failures)
    assert result.passed == PASSING[path.name], f"{result.passed}/{result.steps} passed\n{detail}"
