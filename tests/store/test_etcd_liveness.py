"""Agent liveness through an etcd lease, as a user sees it in `hvfleet get`.

A real long-running agent (libvirt test driver host) holds a lease with a
short TTL against the session's real etcd; once it stops, `hvfleet get
hypervisors` shows the host NotReady within the lease TTL, although its last
status still says Ready=True.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.support.etcd_local import EtcdCluster, free_port

from hvfleet.agent.runner import Agent, AgentConfig
from hvfleet.model import Hypervisor
from hvfleet.model.meta import find_condition
from hvfleet.store.etcd import EtcdStore

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "examples" / "fleet" / "compute-01.xml"






def _ready_column(out: str, name: str) -> str:
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0] == name:
            return cells[1]
    raise AssertionError(f"{name} not in:\n{out}")


@pytest.mark.timeout(90)
def test_get_shows_a_host_notready_within_the_lease_ttl_after_its_agent_stops(
    etcd_session: EtcdCluster, run: Any
) -> None:
    url = etcd_session.url(prefix=f"/live-{uuid.uuid4().hex[:10]}")
    store = EtcdStore.from_url(url)
    ttl = 2
    agent = Agent(AgentConfig(uri=f"test://{NODE}", lease_ttl=ttl, resync=5), store)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while store.agent_liveness() != {"compute-01": True}:
            assert time.monotonic() < deadline, "the agent never took its lease"
            time.sleep(0.1)
        while True:
            got = run("get", "hypervisors", "--store", url)
            if got.code == 0 and "compute-01" in got.out and _ready_column(got.out, "compute-01") == "Ready":
                break
            assert time.monotonic() < deadline, f"agent never reported Ready: {got}"
            time.sleep(0.2)
        # Alive past several TTLs: the agent renews its lease.
        time.sleep(ttl * 2)
        assert _ready_column(run("get", "hypervisors", "--store", url).out, "compute-01") == "Ready"
    finally:
        stop.set()
        runner.join(10)
    stopped_at = time.monotonic()
    while True:
        state = _ready_column(run("get", "hypervisors", "--store", url).out, "compute-01")
        if state == "NotReady":
            break
        # Lease TTL, plus etcd's expiry check period (500 ms) and the CLI's own run.
        assert time.monotonic() - stopped_at < ttl + 1.5, "still shown live after the TTL"
        time.sleep(0.1)
    # `capacity` tells the same as `get`.
    assert _ready_column(run("capacity", "--store", url).out, "compute-01") == "NotReady"
    # The stored status still says Ready: only the lease tells the truth.
    ready = find_condition(store.get_hypervisor("compute-01").status.conditions, "Ready")
    assert ready is not None and ready.status == "True"
    store.close()


@pytest.mark.timeout(60)
def test_cli_against_an_unreachable_etcd_fails_with_one_line_naming_it(run: Any) -> None:
    port = free_port()
    t0 = time.monotonic()
    got = run("get", "hypervisors", "--store", f"etcd://127.0.0.1:{port}?timeout=2")
    assert time.monotonic() - t0 < 5
    assert got.code == 1
    lines = got.err.strip().splitlines()
    assert len(lines) == 1, got.err
    assert f"127.0.0.1:{port}" in lines[0] and "connection refused" in lines[0]


def test_store_prefix_option_selects_the_fleet(
    etcd_session: EtcdCluster, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The option sets the variable for the process; the test restores it after.
    monkeypatch.setenv("HVFLEET_STORE_PREFIX", "")
    fleet = f"/fleet-{uuid.uuid4().hex[:8]}"
    store = EtcdStore(etcd_session.endpoints, fleet)
    store.create(Hypervisor.model_validate({"metadata": {"name": "hv-a"}}), "operator")
    url = etcd_session.url()
    got = run("--store-prefix", fleet, "get", "hypervisors", "--store", url)
    assert got.code == 0 and "hv-a" in got.out, got
    got = run("--store-prefix", fleet + "-other", "get", "hypervisors", "--store", url)
    assert got.code == 0 and "hv-a" not in got.out and "No hypervisors found" in got.err, got
    store.close()
