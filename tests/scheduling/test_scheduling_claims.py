"""Claims on the real stores (SQLite and etcd): re-checked and written
atomically, never double-booked, also under concurrency from several processes."""

from __future__ import annotations

import multiprocessing
import random
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sched_fleet import host, now, put_host

from hvfleet.cli.exit_codes import exit_code_of
from hvfleet.model import Reservation, ResourceName
from hvfleet.model.capacity import free_capacity
from hvfleet.model.errors import Conflict, NotFound
from hvfleet.scheduling.claims import (
    claim_reservation,
    gc,
    new_reservation,
    release,
    reserve,
    reserve_auto,
)
from hvfleet.scheduling.errors import ConsumerAlreadyHolds, DoesNotFit, NoHostFits
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import Request, parse_request
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager

CPU = ResourceName("cpu")
MEM = ResourceName("memory")
ONE = parse_request("2", "4Gi")


@pytest.fixture(params=["sqlite", "etcd"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "etcd":
        etcd = request.getfixturevalue("etcd_session")
        return str(etcd.url(prefix=f"/sched-{uuid.uuid4().hex[:12]}"))
    return f"sqlite:///{tmp_path}/hvfleet.db"


@pytest.fixture
def store(url: str) -> Any:
    s = open_store(url)
    yield s
    s.close()


def test_claim_takes_space_and_refuses_what_no_longer_fits(store: Store) -> None:
    put_host(store, host("a", {"cpu": 4, "memory": "16Gi"}, beat=now()))
    r1 = reserve(store, "a", ONE, "vm-1")
    assert r1.status.phase == "Active" and r1.spec.resources == {CPU: 2, MEM: 4 * 2**30}
    reserve(store, "a", ONE, "vm-2")
    with pytest.raises(DoesNotFit, match=r"does not fit on a: cpu: needs 2, 0 free") as err:
        reserve(store, "a", ONE, "vm-3")
    assert exit_code_of(err.value) == 3
    release(store, r1.name)
    reserve(store, "a", ONE, "vm-3")


def test_a_consumer_holds_one_reservation_per_host(store: Store) -> None:
    put_host(store, host("a", {"cpu": 8, "memory": "16Gi"}, beat=now()))
    reserve(store, "a", ONE, "vm-1")
    with pytest.raises(Conflict, match="already holds"):
        reserve(store, "a", ONE, "vm-1")


def test_a_confirmed_claim_is_still_the_consumers_one_reservation_on_that_host(store: Store) -> None:
    # The instance runs, so the claim is Confirmed at once; it still holds its
    # VGPU (libvirt does not see it) for the instance's lifetime. A second claim
    # would hold another one for the same instance.
    put_host(store, host("a", {"cpu": 8, "memory": "16Gi"}, extra={"VGPU": 4}, beat=now(),
                         instances=["vm-1"]))
    gpu = parse_request("2", None, ["VGPU=1"])
    held = reserve(store, "a", gpu, "vm-1")
    with pytest.raises(ConsumerAlreadyHolds, match=f"vm-1 already holds reservation {held.name} on a"):
        reserve(store, "a", gpu, "vm-1")
    again = new_reservation("a", gpu, "vm-1", None, now())
    with pytest.raises(ConsumerAlreadyHolds):  # the API's create (POST) runs the same check
        claim_reservation(store, again, "scheduler")
    assert [r.name for r in store.list_reservations()] == [held.name]
    # A recorded Confirmed claim whose instance is gone covers nothing: the
    # consumer may claim that host again.
    gc(store)
    assert store.get("Reservation", held.name).status.phase == "Confirmed"  # type: ignore[union-attr]
    store.update_hypervisor("a", lambda h: h.model_copy(update={
        "status": h.status.model_copy(update={"instances": []})}), agent_manager("a"))
    reserve(store, "a", gpu, "vm-1")


def test_auto_does_not_move_a_consumer_that_already_holds_a_host_elsewhere(store: Store) -> None:
    put_host(store, host("a", {"cpu": 8, "memory": "16Gi"}, allocation={"cpu": 4}, beat=now()))
    put_host(store, host("b", {"cpu": 8, "memory": "16Gi"}, beat=now()))
    held = reserve(store, "a", ONE, "vm-1")
    with pytest.raises(ConsumerAlreadyHolds) as err:
        reserve_auto(store, ONE, "vm-1")  # binpack tries a first: vm-1 is there already
    assert isinstance(err.value, Conflict) and exit_code_of(err.value) == 4
    assert (err.value.consumer, err.value.reservation, err.value.host) == ("vm-1", held.name, "a")
    assert [r.spec.hypervisor for r in store.list_reservations()] == ["a"]


def test_claims_on_unknown_hosts_or_hosts_in_maintenance_fail(store: Store) -> None:
    put_host(store, host("m", {"cpu": 8}, maintenance="drain", beat=now()))
    with pytest.raises(NotFound):
        reserve(store, "nope", ONE, "vm-1")
    with pytest.raises(DoesNotFit, match="maintenance"):
        reserve(store, "m", parse_request("1", None), "vm-1")


def test_expired_reservations_stop_counting_and_gc_removes_ended_ones(store: Store) -> None:
    put_host(store, host("a", {"cpu": 4}, beat=now(), instances=["vm-running"]))
    short = reserve(store, "a", parse_request("2", None), "vm-1", ttl=timedelta(milliseconds=1))
    confirmed = reserve(store, "a", parse_request("1", None), "vm-running")
    released = release(store, reserve(store, "a", parse_request("1", None), "vm-3").name)
    keep = reserve(store, "a", parse_request("4", None), "vm-4")  # fits: the rest ended
    removed = gc(store)
    assert {(v.reservation.name, v.phase) for v in removed} == {
        (short.name, "Expired"),
        (confirmed.name, "Confirmed"),
        (released.name, "Released"),
    }
    assert [r.name for r in store.list_reservations()] == [keep.name]
    assert gc(store) == []


def test_auto_picks_the_best_host_and_moves_on_when_full(store: Store) -> None:
    put_host(store, host("a", {"cpu": 4, "memory": "8Gi"}, beat=now()))
    put_host(store, host("b", {"cpu": 4, "memory": "8Gi"}, allocation={"cpu": 2}, beat=now()))
    index = FleetIndex.from_store(store)
    hosts = [reserve_auto(store, ONE, f"vm-{i}", index=index).reservation.spec.hypervisor for i in range(3)]
    assert hosts == ["b", "a", "a"]  # binpack: the fuller host first
    with pytest.raises(NoHostFits):
        reserve_auto(store, ONE, "vm-x", index=index)


def _free_never_negative(url: str) -> None:
    """Replay the store's whole history: after every event, every host's free
    capacity (model function, through the index) is >= 0."""
    with open_store(url) as s:
        index = FleetIndex()
        for event in s.watch(None, since=0, timeout=0):
            index.apply(event)
            if isinstance(event.object, Reservation):
                name = event.object.spec.hypervisor
                assert all(v >= 0 for v in index.free(name).values()), (event.revision, name)


def _claim_worker(url: str, hosts: list[str] | None, request: Request, n: int, seed: int) -> dict[str, int]:
    out = {"ok": 0, "does_not_fit": 0, "other": 0}
    rng = random.Random(seed)
    with open_store(url) as s:
        index = FleetIndex.from_store(s) if hosts is None else None
        for _ in range(n):
            consumer = str(uuid.UUID(int=rng.getrandbits(128)))
            try:
                if hosts is None:
                    reserve_auto(s, request, consumer, index=index)
                else:
                    reserve(s, rng.choice(hosts), request, consumer)
                out["ok"] += 1
            except (DoesNotFit, NoHostFits):
                out["does_not_fit"] += 1
            except Exception:
                out["other"] += 1
    return out


def _run(url: str, hosts: list[str] | None, request: Request) -> list[dict[str, int]]:
    # spawn, not fork: a child forked while another thread of the session holds
    # SQLite's or any other lock waits for it for ever (a forked worker of the
    # store contract suite hung in sqlite3.connect so).
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        return pool.starmap(_claim_worker, [(url, hosts, request, 50, seed) for seed in range(8)])


def test_claim_never_overbooks_under_concurrency(url: str, store: Store) -> None:
    k = 37
    # Room for exactly 37 instances of 1 cpu / 2Gi: cpu 30 × 1.25 = 37 (memory has more).
    put_host(store, host("a", {"cpu": 30, "memory": "100Gi"}, overcommit={"cpu": 1.25}, beat=now()))
    results = _run(url, ["a"], parse_request("1", "2Gi"))
    assert sum(r["ok"] for r in results) == k
    assert sum(r["does_not_fit"] for r in results) == 8 * 50 - k
    assert sum(r["other"] for r in results) == 0
    h = store.get_hypervisor("a")
    free = free_capacity(h, store.list_reservations(), now())
    assert free[CPU] == 0
    _free_never_negative(url)


def test_auto_claims_across_twenty_hosts_fill_exactly_the_fleets_room(url: str, store: Store) -> None:
    rng = random.Random(20)
    room = 0
    for i in range(20):
        cpus = rng.randint(2, 24)
        ratio = rng.choice([1.0, 1.5, 0.5, 2.0])
        used = rng.randint(0, cpus // 2)
        h = host(
            f"hv-{i:02d}",
            {"cpu": cpus, "memory": "256Gi"},
            allocation={"cpu": used},
            overcommit={"cpu": ratio},
            beat=now(),
        )
        put_host(store, h)
        room += (int(cpus * ratio) - used) // 2
    assert room < 8 * 50
    results = _run(url, None, parse_request("2", "1Gi"))
    assert sum(r["ok"] for r in results) == room
    assert sum(r["other"] for r in results) == 0
    for h in store.list_hypervisors():
        free = free_capacity(h, store.list_reservations(), now())
        assert 0 <= free[CPU] < 2, h.name
    _free_never_negative(url)
