"""Placement 16.0's gabbi files about allocation candidates (granular groups,
NUMA and sharing providers, same_subtree, root_required, member_of, any-of
traits, mappings) against `hvfleet.placement.candidates`, their fixtures built
as provider graphs and served by a stand-in edge (tests/placement/
candidates_gabbi.py). Every step of the eleven files must pass."""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest

from tests.placement.candidates_gabbi import FILES, EdgeServer, fixture_module, run_file


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
