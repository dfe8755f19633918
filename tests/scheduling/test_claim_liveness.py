"""A claim judges its host's readiness with the agent's Lease, as fit and the
fleet index do (`model.readiness`): with leases the agent rewrites an unchanged
status only every few minutes, so the heartbeat in status may be older than
the staleness while the live Lease says the agent is there; and an expired
Lease means the last status is a dead agent's word, however fresh it looks."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sched_fleet import host, now, put_host

from hvfleet.scheduling.claims import reserve, reserve_auto
from hvfleet.scheduling.errors import DoesNotFit, NoHostFits
from hvfleet.scheduling.request import parse_request
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager

ONE = parse_request("1", "1Gi")


@pytest.fixture(params=["sqlite", "etcd"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "etcd":
        etcd = request.getfixturevalue("etcd_session")
        url = str(etcd.url(prefix=f"/claim-live-{uuid.uuid4().hex[:12]}"))
    else:
        url = f"sqlite:///{tmp_path}/hvfleet.db"
    s = open_store(url)
    yield s
    s.close()


def test_a_live_lease_is_the_heartbeat_of_a_claim(store: Store) -> None:
    # Last status write 4 minutes ago (the agent's status resync is 5 minutes),
    # older than the default staleness (3 minutes); the Lease is live.
    put_host(store, host("a", {"cpu": 4, "memory": "16Gi"}, beat=now() - timedelta(minutes=4)))
    store.keepalive("a", 60)
    made = reserve(store, "a", ONE, "vm-1")
    assert made.spec.hypervisor == "a"
    auto = reserve_auto(store, ONE, "vm-2")
    assert auto.reservation.spec.hypervisor == "a"


def test_a_claim_refuses_a_host_whose_lease_expired(store: Store) -> None:
    put_host(store, host("a", {"cpu": 4, "memory": "16Gi"}, beat=now()))
    lease = store.keepalive("a", 60)
    # The agent renewed last 2 minutes ago for 60 s: expired, status still fresh.
    old = lease.spec.model_copy(update={"renew_time": now() - timedelta(minutes=2)})
    store.update(lease.model_copy(update={"spec": old}), agent_manager("a"))
    with pytest.raises(DoesNotFit, match="lease expired"):
        reserve(store, "a", ONE, "vm-1")
    with pytest.raises(NoHostFits):
        reserve_auto(store, ONE, "vm-2")
