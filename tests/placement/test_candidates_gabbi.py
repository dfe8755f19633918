"""Placement 16.0's gabbi files about allocation candidates (granular groups,
NUMA and sharing providers, same_subtree, root_required, member_of, any-of
traits, mappings): every step of the eleven files must pass

- against `hvfleet.placement.candidates` alone, their fixtures built as
  provider graphs and served by the stand-in edge of
  tests/placement/candidates_gabbi.py;
- through `hvfleet serve` (HTTPS, an admin token, /placement), the same
  fixtures seeded through hvfleet's Placement API on a fresh set of
  Placement records per file."""

from __future__ import annotations

import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvfleet.server.app import create_app
from hvfleet.server.auth import RoleAuthorizer, TokenAuthenticator
from hvfleet.store import open_store
from tests.placement.candidates_gabbi import (
    FILES,
    GABBITS,
    EdgeServer,
    fixture_module,
    run_file,
    run_file_served,
    served_fixture_module,
)
from tests.placement.gabbi_runner import Tokens, issue_tokens, reset, suite_dict
from tests.server.running import ServerThread
from tests.server.tls_files import make_tls_files


@pytest.fixture(scope="module")
def edge() -> Iterator[tuple[int, types.ModuleType]]:
    with EdgeServer() as server:
        yield server.port, fixture_module()


@pytest.mark.parametrize("name", FILES)
def test_placement_candidates_gabbi_file_passes_every_step(
    edge: tuple[int, types.ModuleType], name: str
) -> None:
    port, fixtures = edge
    result = run_file(name, port, fixtures)
    assert result.candidate_steps > 0
    assert result.passed == result.steps, "\n".join(result.failures)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[int, Tokens, types.ModuleType]]:
    d = Path(tempfile.mkdtemp())
    store = open_store(f"sqlite:///{d}/hvfleet.db")
    tokens = issue_tokens(store)
    app = create_app(store, TokenAuthenticator(store), RoleAuthorizer(), dashboard_pages=False)
    with ServerThread(app, make_tls_files(d / "tls")) as server:
        yield server.port, tokens, served_fixture_module(server.port, tokens.admin, lambda: reset(store))
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_placement_candidates_gabbi_file_passes_every_step_through_hvfleet_serve(
    served: tuple[int, Tokens, types.ModuleType], name: str
) -> None:
    port, tokens, fixtures = served
    result = run_file_served(name, port, suite_dict(GABBITS / name, tokens), fixtures)
    assert result.candidate_steps > 0
    assert result.passed == result.steps, "\n".join(result.failures)
