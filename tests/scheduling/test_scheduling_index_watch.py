"""The fleet index follows the store's watch: no rescan per query."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sched_fleet import OPERATOR, host, now, put_host

from hvfleet.model import ResourceName
from hvfleet.scheduling.claims import release, reserve
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import parse_request
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager

CPU = ResourceName("cpu")
ONE = parse_request("1", None)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/hvfleet.db")
    yield s
    s.close()


def names(index: FleetIndex, cpu: str = "1") -> list[str]:
    return [c.name for c in index.fit(parse_request(cpu, None)).candidates]


def test_index_refresh_applies_hosts_reservations_updates_and_deletes(store: Store) -> None:
    put_host(store, host("a", {"cpu": 4}, beat=now()))
    index = FleetIndex.from_store(store)
    assert names(index) == ["a"]
    put_host(store, host("b", {"cpu": 8}, beat=now()))
    r = reserve(store, "a", parse_request("4", None), "vm-1")
    assert names(index) == ["a"]  # not refreshed yet: the index does not rescan
    assert index.refresh(store) >= 3
    assert names(index) == ["b"] and index.free("a") == {CPU: 0}
    release(store, r.name)
    store.update_hypervisor(
        "b",
        lambda h: h.model_copy(update={"spec": h.spec.model_copy(update={"maintenance": "drain"})}),
        OPERATOR,
    )
    index.refresh(store)
    assert names(index) == ["a"]
    store.delete("Reservation", r.name)
    store.delete("Hypervisor", "b")
    index.refresh(store)
    assert names(index) == ["a"] and len(index) == 1
    # Agent status writes (allocation grows) are seen too.
    h = store.get_hypervisor("a")
    status = h.status.model_copy(update={"allocation": {CPU: h.status.capacity[CPU]}})
    store.update(h.model_copy(update={"status": status}), agent_manager("a"))
    index.refresh(store)
    assert names(index) == []


def test_index_follows_the_watch_in_the_background(store: Store) -> None:
    index = FleetIndex.from_store(store)
    stop = threading.Event()
    thread = index.follow(store, stop)
    try:
        put_host(store, host("late", {"cpu": 2}, beat=now()))
        deadline = time.monotonic() + 10
        while names(index) != ["late"]:
            assert time.monotonic() < deadline, "the index never saw the new host"
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()
