"""The real `hvfleet agent` process on a test-driver node file: clean exit on
SIGTERM/SIGINT within 2 s, Prometheus metrics, spec watch, the liveness Lease
and status heartbeats."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from hvfleet.model.errors import NotFound
from hvfleet.model.lease import Lease
from hvfleet.store import Store, open_store

from .conftest import GI, fleet_uri, free_port, hvfleet, scrape, start_agent, stop, wait_for


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_agent_exits_cleanly_within_2s_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    db = tmp_path / "hv.db"
    agent = start_agent("--connect", fleet_uri("edge-01"), "--store", f"sqlite:///{db}")
    try:
        with open_store(f"sqlite:///{db}") as store:
            wait_for(store, "edge-01", lambda h: bool(h.status.capacity), 20)
    finally:
        rc, took, err = stop(agent, sig)
    assert rc == 0, err
    assert took < 2.0


def test_metrics_and_spec_watch_of_a_running_agent(tmp_path: Path) -> None:
    db = tmp_path / "hv.db"
    port = free_port()
    agent = start_agent("--connect", fleet_uri("compute-01"), "--store", f"sqlite:///{db}",
                        "--metrics-addr", f"127.0.0.1:{port}", "--resync", "60s")
    try:
        with open_store(f"sqlite:///{db}") as store:
            wait_for(store, "compute-01", lambda h: bool(h.status.capacity), 20)
            labels = lambda r: (("hypervisor", "compute-01"), ("resource", r))  # noqa: E731
            m = scrape(port)
            assert m[("hvfleet_hypervisor_capacity", labels("cpu"))] == 32
            assert m[("hvfleet_hypervisor_capacity", labels("memory"))] == 128 * GI
            assert m[("hvfleet_hypervisor_allocation", labels("cpu"))] == 18
            assert m[("hvfleet_hypervisor_allocation", labels("memory"))] == 52 * GI
            assert m[("hvfleet_hypervisor_effective_capacity", labels("cpu"))] == 32
            host = (("hypervisor", "compute-01"),)
            assert m[("hvfleet_agent_reconcile_duration_seconds_count", host)] >= 1
            assert m[("hvfleet_agent_libvirt_connected", host)] == 1
            assert m[("hvfleet_agent_libvirt_reconnects_total", host)] == 0

            # An operator changes spec with the real CLI; the agent confirms it.
            out = hvfleet("overcommit", "set", "compute-01", "cpu=4", "memory=1.5",
                          "--store", f"sqlite:///{db}")
            assert out.returncode == 0, out.stderr
            _, h = wait_for(store, "compute-01",
                               lambda h: h.status.effective_capacity["cpu"] == 128, 2.0)
            # memory: 128Gi x 1.5 = 192Gi; each 64Gi cell: 96Gi
            assert h.status.effective_capacity["memory"] == 192 * GI
            assert [c.effective_capacity["cpu"] for c in h.status.cells] == [64, 64]
            assert [c.effective_capacity["memory"] for c in h.status.cells] == [96 * GI] * 2
            assert h.status.observed_generation == h.metadata.generation
            time.sleep(0.2)
            m = scrape(port)
            assert m[("hvfleet_hypervisor_effective_capacity", labels("cpu"))] == 128
    finally:
        rc, _, err = stop(agent, signal.SIGTERM)
    assert rc == 0, err


def _status_writes(store: Store, name: str, since: int) -> int:
    return len(list(store.watch("Hypervisor", since=since, name=name, timeout=0.3)))


def _wait_for_lease(store: Store, name: str, timeout: float) -> Lease:
    deadline = time.monotonic() + timeout
    while True:
        try:
            lease = store.get("Lease", name)
            assert isinstance(lease, Lease)
            return lease
        except NotFound:
            if time.monotonic() > deadline:
                raise AssertionError(f"no Lease {name} within {timeout}s") from None
            time.sleep(0.05)


def test_idle_agent_renews_its_lease_and_leaves_its_status_alone(tmp_path: Path) -> None:
    db = tmp_path / "hv.db"
    agent = start_agent("--connect", fleet_uri("lab-01"), "--store", f"sqlite:///{db}",
                        "--resync", "1s", "--lease-ttl", "3s")
    try:
        with open_store(f"sqlite:///{db}") as store:
            _, first = wait_for(store, "lab-01", lambda h: bool(h.status.capacity), 20)
            rv = int(first.metadata.resource_version or 0)
            # The Lease thread may write its first renewal just after the first status.
            lease = _wait_for_lease(store, "lab-01", 10)
            time.sleep(2.6)
            renewed = store.get("Lease", "lab-01")
            writes = _status_writes(store, "lab-01", rv)
            live = store.agent_liveness()
    finally:
        rc, _, err = stop(agent, signal.SIGTERM)
    assert rc == 0, err
    # Two or three full resyncs found nothing new: no status write at all ...
    assert writes == 0
    # ... while the Lease was renewed every second (ttl 3 s / 3).
    assert isinstance(lease, Lease) and isinstance(renewed, Lease)
    assert 2 <= renewed.metadata.generation - lease.metadata.generation <= 3
    assert renewed.spec.holder_identity == "agent/lab-01"
    assert live == {"lab-01": True}


def test_idle_agent_rewrites_its_status_once_per_status_resync(tmp_path: Path) -> None:
    db = tmp_path / "hv.db"
    agent = start_agent("--connect", fleet_uri("lab-01"), "--store", f"sqlite:///{db}",
                        "--resync", "1s", "--status-resync", "1s")
    try:
        with open_store(f"sqlite:///{db}") as store:
            _, first = wait_for(store, "lab-01", lambda h: bool(h.status.capacity), 20)
            rv = int(first.metadata.resource_version or 0)
            time.sleep(2.6)
            h = store.get_hypervisor("lab-01")
            writes = _status_writes(store, "lab-01", rv)
    finally:
        rc, _, err = stop(agent, signal.SIGTERM)
    assert rc == 0, err
    # nothing changed: one heartbeat per 1 s status resync (2 or 3 in 2.6 s), never more
    assert 2 <= writes <= 3
    assert h.status.last_heartbeat_time is not None
    assert first.status.last_heartbeat_time is not None
    assert h.status.last_heartbeat_time > first.status.last_heartbeat_time
    assert h.status.allocation == first.status.allocation
    # conditions did not flap: same transition time as the first write
    assert h.status.conditions == first.status.conditions


def test_libvirt_down_at_start_is_recorded_and_the_agent_keeps_trying(tmp_path: Path) -> None:
    db = tmp_path / "hv.db"
    uri = f"qemu:///system?socket={tmp_path}/no-libvirtd-here"
    agent = start_agent("--connect", uri, "--name", "down-host", "--store", f"sqlite:///{db}")
    try:
        with open_store(f"sqlite:///{db}") as store:
            _, h = wait_for(store, "down-host", lambda h: bool(h.status.conditions), 10)
            (connected,) = [c for c in h.status.conditions if c.type == "LibvirtConnected"]
            assert (connected.status, connected.reason) == ("False", "Disconnected")
            assert "cannot connect" in connected.message
            assert not h.status.capacity  # nothing observed, nothing made up
        assert agent.poll() is None  # still running, retrying with backoff
    finally:
        rc, took, err = stop(agent, signal.SIGTERM)
    assert rc == 0, err
    assert took < 2.0
