"""Shared helpers for the agent tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from hvfleet.discovery.host import HostTopology, NodeInfo, parse_host_topology

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "examples" / "fleet"

GI = 2**30
MI = 2**20

# What no test-driver or qemu host reports when a file has real topology.
UNUSED_NODE_INFO = NodeInfo("x86_64", 0, 0, 0, 1, 1, 1, 1)


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def two_cell_host() -> HostTopology:
    caps = fixture_text("two-cell-hugepages-capabilities.xml")
    return parse_host_topology(caps, UNUSED_NODE_INFO)


@pytest.fixture
def two_cells() -> HostTopology:
    return two_cell_host()


@pytest.fixture(scope="session")
def two_cells_topology() -> HostTopology:
    """The same host as `two_cells`, shared by hypothesis examples."""
    return two_cell_host()
