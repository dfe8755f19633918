"""The fleet index follows agents' Lease objects through its watch: renewals
arrive as events, an expiry is noticed by the clock at the next refresh, and
no refresh lists the Leases again. On every store backend."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sched_fleet import host, now, put_host

from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import parse_request
from hvfleet.store import open_store


@pytest.fixture(params=["sqlite", "etcd"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "etcd":
        etcd = request.getfixturevalue("etcd_session")
        return str(etcd.url(prefix=f"/index-leases-{uuid.uuid4().hex[:12]}"))
    return f"sqlite:///{tmp_path}/hvfleet.db"


def test_the_index_judges_leases_from_its_watch_without_listing_them(store_url: str) -> None:
    store = open_store(store_url)
    lists = 0
    real = store.agent_leases

    def counted() -> dict:  # type: ignore[type-arg]
        nonlocal lists
        lists += 1
        return real()

    store.agent_leases = counted  # type: ignore[method-assign]
    old = now() - timedelta(hours=1)  # a status heartbeat far older than the staleness
    put_host(store, host("hv-a", {"cpu": 8, "memory": "32Gi"}, allocation={"cpu": 6}, beat=old))
    put_host(store, host("hv-b", {"cpu": 8, "memory": "32Gi"}, beat=old))
    store.keepalive("hv-a", 1)
    store.keepalive("hv-b", 60)
    index = FleetIndex.from_store(store)
    request = parse_request("1", None)
    # A live Lease is the heartbeat: both are candidates despite their old status.
    assert index.fit(request).names == ["hv-a", "hv-b"]
    assert lists == 1

    time.sleep(1.2)  # hv-a's agent stops renewing: its 1 s Lease runs out, no event
    index.refresh(store)
    assert index.fit(request, why=True).names == ["hv-b"]
    store.keepalive("hv-a", 60)  # back: a renewal, which the watch delivers
    index.refresh(store)
    assert index.fit(request).names == ["hv-a", "hv-b"]
    store.release("hv-b")
    index.refresh(store)
    assert index.fit(request).names == ["hv-a"]
    assert lists == 1, "a refresh listed the Leases again"
    store.close()
