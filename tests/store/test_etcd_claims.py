"""Claims never overbook: run against every backend (SQLite and a real etcd),
plus the etcd-only proofs that a claim re-checks when its host or the host's
reservation set changes between its read and its write.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.store.conftest import STORE_BACKENDS
from tests.support.etcd_local import EtcdCluster

from hvfleet.model import Hypervisor, InvalidInput, Quantity, Reservation, free_capacity
from hvfleet.store import Store, open_store
from hvfleet.store.etcd import EtcdStore

MakeHv = Callable[..., Hypervisor]


class DoesNotFit(InvalidInput):
    pass


def fits(host: Hypervisor, others: list[Reservation], want: Reservation) -> None:
    free = free_capacity(host, others)
    for resource, amount in want.spec.resources.items():
        if free.get(resource, Quantity(0)) < amount:
            raise DoesNotFit(f"{want.name}: {resource} {amount} does not fit on {host.name}")


def _reservation(name: str, host: str, cpu: int = 1, source: str = "hvfleet") -> Reservation:
    return Reservation.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"hypervisor": host, "resources": {"cpu": cpu}, "consumer": f"uuid-{name}",
                     "source": source},
        }
    )


def _host_with_cpus(store: Store, make_hypervisor: MakeHv, name: str, cpus: int) -> None:
    store.create(make_hypervisor(name), "operator")

    def with_capacity(h: Hypervisor) -> Hypervisor:
        status = h.status.model_copy(update={"capacity": {"cpu": Quantity(cpus)}})
        return h.model_copy(update={"status": status})

    store.update_hypervisor(name, with_capacity, f"agent/{name}")


def _claim_many(
    url: str, worker: int, tries: int, go: Any, out: multiprocessing.Queue[tuple[int, int]]
) -> None:
    store = open_store(url)
    store.get("Hypervisor", "hv1")  # connected and warm before the start signal
    won = lost = 0
    go.wait(60)
    for i in range(tries):
        want = _reservation(f"w{worker}-{i}", "hv1")
        try:
            store.claim(want, "scheduler", lambda h, others, want=want: fits(h, others, want))
            won += 1
        except DoesNotFit:
            lost += 1
    store.close()
    out.put((won, lost))


@pytest.fixture(params=["etcd", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The backends whose own claim runs the caller's check inside their write.
    Over the API (remote) the server runs its scheduling check instead; its
    claims are the SQLite store's, raced in tests/server and tests/cli."""
    with STORE_BACKENDS[request.param](request, tmp_path) as url:
        yield url


@pytest.mark.timeout(240)
def test_claims_from_many_processes_never_overbook(
    store: Store, store_url: str, make_hypervisor: MakeHv
) -> None:
    _host_with_cpus(store, make_hypervisor, "hv1", 8)
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[tuple[int, int]] = ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(target=_claim_many, args=(store_url, w, 5, go, results)) for w in range(6)
    ]
    for p in procs:
        p.start()
    time.sleep(2)  # let every worker connect, then start them together
    go.set()
    outcomes = [results.get(timeout=200) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sum(won for won, _ in outcomes) == 8
    assert sum(lost for _, lost in outcomes) == 30 - 8
    held = store.list_reservations()
    assert len(held) == 8
    assert free_capacity(store.get_hypervisor("hv1"), held) == {"cpu": 0}


@pytest.fixture
def etcd_pair(etcd_session: EtcdCluster) -> tuple[EtcdStore, EtcdStore]:
    """Two clients of one fleet, as a scheduler and someone else would be."""
    prefix = f"/t-{uuid.uuid4().hex[:12]}"
    return EtcdStore(etcd_session.endpoints, prefix), EtcdStore(etcd_session.endpoints, prefix)


def test_claim_rechecks_when_another_reservation_lands_during_its_check(
    etcd_pair: tuple[EtcdStore, EtcdStore], make_hypervisor: MakeHv
) -> None:
    scheduler, other = etcd_pair
    _host_with_cpus(scheduler, make_hypervisor, "hv1", 4)
    seen: list[list[str]] = []
    want = _reservation("mine", "hv1", cpu=2)

    def check(h: Hypervisor, others: list[Reservation]) -> None:
        seen.append(sorted(o.name for o in others))
        if len(seen) == 1:
            # Between this claim's read and its write, someone takes 3 of the 4 CPUs
            # with a plain create (not a claim).
            other.create(_reservation("interloper", "hv1", cpu=3), "someone")
        fits(h, others, want)

    with pytest.raises(DoesNotFit):
        scheduler.claim(want, "scheduler", check)
    assert seen == [[], ["interloper"]]
    assert [r.name for r in scheduler.list_reservations()] == ["interloper"]


def test_claim_rechecks_when_a_reservation_grows_or_the_host_changes(
    etcd_pair: tuple[EtcdStore, EtcdStore], make_hypervisor: MakeHv
) -> None:
    scheduler, other = etcd_pair
    _host_with_cpus(scheduler, make_hypervisor, "hv1", 4)
    # A Placement mirror: the one kind of reservation that may grow after its write
    # (a claim may not: model.capacity.growth_past_claim); the claim view must follow it.
    small = scheduler.create(_reservation("small", "hv1", cpu=1, source="placement"), "someone")
    assert isinstance(small, Reservation)
    calls: list[tuple[str, str]] = []
    want = _reservation("mine", "hv1", cpu=2)

    def check(h: Hypervisor, others: list[Reservation]) -> None:
        calls.append((h.metadata.resource_version or "", ",".join(o.name for o in others)))
        if len(calls) == 1:
            # The host's agent writes status (the host key changes; a write
            # that changed nothing would not be written)...
            other.update_hypervisor("hv1", lambda h: h.model_copy(update={"status": h.status.model_copy(
                update={"observed_generation": (h.status.observed_generation or 0) + 1})}),
                "agent/hv1")
        elif len(calls) == 2:
            # ...then an existing reservation is updated to hold more.
            grown = other.get("Reservation", "small")
            assert isinstance(grown, Reservation)
            spec = grown.spec.model_copy(update={"resources": {"cpu": Quantity(3)}})
            other.update(grown.model_copy(update={"spec": spec}), "someone")
        fits(h, others, want)

    with pytest.raises(DoesNotFit):
        scheduler.claim(want, "scheduler", check)
    assert len(calls) == 3
    assert calls[0][0] != calls[1][0], "the retry did not re-read the host"
    assert [r.name for r in scheduler.list_reservations()] == ["small"]


def test_moving_a_reservation_to_another_host_moves_it_in_the_claim_view(
    etcd_pair: tuple[EtcdStore, EtcdStore], make_hypervisor: MakeHv
) -> None:
    store, _ = etcd_pair
    _host_with_cpus(store, make_hypervisor, "hv1", 2)
    _host_with_cpus(store, make_hypervisor, "hv2", 2)
    # A Placement mirror may move with Placement's allocation; a claim may not.
    r = store.create(_reservation("r", "hv1", cpu=2, source="placement"), "someone")
    assert isinstance(r, Reservation)
    moved = r.model_copy(update={"spec": r.spec.model_copy(update={"hypervisor": "hv2"})})
    store.update(moved, "someone")
    views: dict[str, list[str]] = {}

    def record(h: Hypervisor, others: list[Reservation]) -> None:
        views[h.name] = [o.name for o in others]

    store.claim(_reservation("a", "hv1"), "scheduler", record)
    with pytest.raises(DoesNotFit):
        want = _reservation("b", "hv2")
        store.claim(want, "scheduler", lambda h, o: (record(h, o), fits(h, o, want)))
    assert views == {"hv1": [], "hv2": ["r"]}
    store.delete("Reservation", "r")
    store.claim(_reservation("b", "hv2"), "scheduler", record)
    assert views["hv2"] == []
