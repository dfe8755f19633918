"""Fit and `reserve --auto` leave out a host whose agent's liveness lease
expired, against a real etcd (the session's member), through the real
`hvfleet` entry point and a long-lived fleet index.

The host's stored status still says Ready=True with a fresh heartbeat: only
the lease (short TTL, no longer renewed) tells that its agent is gone.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sched_fleet import host, now, put_host
from tests.support.etcd_local import EtcdCluster

from hvfleet.model import Reservation
from hvfleet.model.meta import find_condition
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import parse_request
from hvfleet.store.etcd import EtcdStore


@pytest.fixture
def fleet(etcd_session: EtcdCluster) -> Iterator[tuple[str, EtcdStore]]:
    url = etcd_session.url(prefix=f"/sched-live-{uuid.uuid4().hex[:10]}")
    store = EtcdStore.from_url(url)
    # hv-full is binpack's first choice while its agent lives; hv-roomy second.
    put_host(store, host("hv-full", {"cpu": 8, "memory": "32Gi"}, allocation={"cpu": 6}, beat=now()))
    put_host(store, host("hv-roomy", {"cpu": 8, "memory": "32Gi"}, beat=now()))
    yield url, store
    store.close()


def wait_for(cond: Callable[[], bool], what: str, seconds: float = 3.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_fit_and_reserve_auto_skip_a_host_whose_agent_lease_expired(
    fleet: tuple[str, EtcdStore], run: Any
) -> None:
    url, store = fleet
    ttl = 1
    store.keepalive("hv-roomy", 60)
    store.keepalive("hv-full", ttl)
    index = FleetIndex.from_store(store)  # long-lived, as in a scheduler
    followed = FleetIndex.from_store(store)  # kept current by its own thread
    stop = threading.Event()
    follower = followed.follow(store, stop, liveness_every=0.2)
    request = parse_request("1", None)
    assert index.fit(request).names == ["hv-full", "hv-roomy"]

    # hv-full's agent stops renewing: its lease expires after the TTL (etcd
    # checks expiry every 500 ms).
    stopped = time.monotonic()
    while store.agent_liveness() != {"hv-full": False, "hv-roomy": True}:
        assert time.monotonic() - stopped < ttl + 3, f"lease still live: {store.agent_liveness()}"
        time.sleep(0.1)
    ready = find_condition(store.get_hypervisor("hv-full").status.conditions, "Ready")
    assert ready is not None and ready.status == "True"  # the status alone would say "candidate"

    # Queries do not ask the store; the index learns liveness when it refreshes.
    assert index.fit(request).names == ["hv-full", "hv-roomy"]
    index.refresh(store)
    result = index.fit(request, why=True)
    assert result.names == ["hv-roomy"]
    assert [r.reason for r in result.rejected["hv-full"]] == ["agent-lease-expired"]
    wait_for(lambda: followed.fit(request).names == ["hv-roomy"], "the following index to drop hv-full")

    r = run("fit", "--cpu", "1", "-o", "json", "--why", "--store", url)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert [c["name"] for c in doc["candidates"]] == ["hv-roomy"]
    assert [w["reason"] for w in doc["rejected"]["hv-full"]] == ["agent-lease-expired"]
    r = run("fit", "--cpu", "1", "--why", "--store", url)
    assert "hv-full: the agent's liveness lease expired" in r.out

    r = run("reserve", "--auto", "--cpu", "1", "--consumer", str(uuid.uuid4()), "--store", url)
    assert r.code == 0, r.err
    made = store.get("Reservation", r.out.strip())
    assert isinstance(made, Reservation) and made.spec.hypervisor == "hv-roomy"

    # The agent comes back: the next refresh makes the host a candidate again.
    store.keepalive("hv-full", 60)
    index.refresh(store)
    assert index.fit(request).names == ["hv-full", "hv-roomy"]
    wait_for(lambda: followed.fit(request).names[0] == "hv-full", "the following index to take hv-full back")
    stop.set()
    follower.join(5)
    r = run("reserve", "--auto", "--cpu", "1", "--consumer", str(uuid.uuid4()), "--store", url)
    made = store.get("Reservation", r.out.strip())
    assert isinstance(made, Reservation) and made.spec.hypervisor == "hv-full"
    store.release("hv-full")
    store.release("hv-roomy")
