"""Shared helpers for the agent tests."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hvfleet.discovery.host import HostTopology, NodeInfo, parse_host_topology
from hvfleet.model.quantity import Quantity

from .waiting import wait_for  # noqa: F401 - the tests import it from here

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


def hvfleet(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the real `hvfleet` command of this checkout."""
    script = Path(sys.executable).parent / "hvfleet"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "hvfleet.cli.main"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout)


def fleet_uri(host: str) -> str:
    return f"test://{FLEET / (host + '.xml')}"


def quantities(values: dict[str, str]) -> dict[str, Quantity]:
    return {k: Quantity.parse(v) for k, v in values.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus samples at 127.0.0.1:PORT/metrics: (name, labels) → value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def start_agent(*args: str) -> subprocess.Popen[str]:
    script = Path(sys.executable).parent / "hvfleet"
    return subprocess.Popen(
        [str(script), "agent", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def stop(agent: subprocess.Popen[str], sig: signal.Signals) -> tuple[int, float, str]:
    """Send `sig` to an agent process: its exit code, how long it took to
    exit, and what it wrote to stderr."""
    started = time.monotonic()
    agent.send_signal(sig)
    rc = agent.wait(10)
    return rc, time.monotonic() - started, agent.stderr.read() if agent.stderr else ""
