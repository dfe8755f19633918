"""Claims never overbook: run against every backend (SQLite and a real etcd),
plus the etcd-only proofs that a claim re-checks when its host or the host's
reservation set changes between its read and its write.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.store.conftest import STORE_BACKENDS
from tests.support.etcd_local import EtcdCluster

from hvfleet.model import Hypervisor, InvalidInput, Quantity, Reservation, free_capacity
from hvfleet.store import Store, open_store
from hvfleet.store import etcd as etcd_store
from hvfleet.store.base import Write
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


def test_a_host_with_more_reservations_than_one_etcd_transaction_takes_still_accepts_claims(
    store: Store, make_hypervisor: MakeHv
) -> None:
    """etcd refuses a transaction of more than 128 operations (--max-txn-ops,
    left at its default by tests/support/etcd_local.py); a host's ended
    reservations stay until `reservations gc`, so a claim's read of them must
    not be bounded by it. The check still sees every one, and counts the live."""
    _host_with_cpus(store, make_hypervisor, "hv1", 12)
    past = "2020-01-01T00:00:00Z"
    for i in range(130):  # ended by their expiry, as the default TTL ends a forgotten one
        store.create(Reservation.model_validate({
            "metadata": {"name": f"old{i:03}"},
            "spec": {"hypervisor": "hv1", "resources": {"cpu": 1}, "consumer": f"uuid-old{i}",
                     "expiresAt": past}}), "scheduler")
    for i in range(20):  # claimed, then released, as `hvfleet release` does
        r = store.claim(_reservation(f"rel{i:02}", "hv1"), "scheduler", lambda h, o: None)
        released = r.status.model_copy(update={"phase": "Released"})
        store.update(r.model_copy(update={"status": released}), "scheduler")
    for i in range(10):
        store.claim(_reservation(f"live{i}", "hv1"), "scheduler", lambda h, o: None)
    seen: list[int] = []

    def check(want: Reservation) -> Callable[[Hypervisor, list[Reservation]], None]:
        def run(h: Hypervisor, others: list[Reservation]) -> None:
            seen.append(len(others))
            free = free_capacity(h, others, datetime.now(UTC))
            if free["cpu"] < want.spec.resources["cpu"]:
                raise DoesNotFit(f"{want.name}: {free['cpu']} CPUs free")
        return run

    want = _reservation("fits", "hv1", cpu=2)
    store.claim(want, "scheduler", check(want))
    assert seen == [160]
    too_much = _reservation("over", "hv1", cpu=1)
    with pytest.raises(DoesNotFit):
        store.claim(too_much, "scheduler", check(too_much))
    assert seen == [160, 161]
    # A batch's claim (Write.check) reads the host's reservations the same way.
    swap = _reservation("swap", "hv1", cpu=1)
    store.write_all([Write("delete", store.get("Reservation", "live0")),
                     Write("create", swap, check=check(swap))], "scheduler")
    assert seen == [160, 161, 160]
    assert len(store.list_reservations()) == 161


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


def test_a_reservation_written_between_two_chunks_of_a_claims_read_makes_it_read_again(
    etcd_pair: tuple[EtcdStore, EtcdStore], make_hypervisor: MakeHv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host's reservations beyond one transaction are read in chunks, each
    guarded by the set key read with the host: a write between two chunks makes
    the claim read them all again, so its check never sees a mix."""
    scheduler, other = etcd_pair
    monkeypatch.setattr(etcd_store, "CLAIM_READS_PER_TXN", 3)
    _host_with_cpus(scheduler, make_hypervisor, "hv1", 8)
    for i in range(7):
        scheduler.create(_reservation(f"r{i}", "hv1"), "someone")
    reads: list[int] = []
    real_txn = scheduler.transport.txn

    def txn(compare: list[dict[str, Any]], success: list[dict[str, Any]], *args: Any,
            **kwargs: Any) -> Any:
        got = real_txn(compare, success, *args, **kwargs)
        if len(compare) == 1 and success and all("request_range" in op for op in success):
            reads.append(len(success))
            if len(reads) == 1:  # between the first chunk and the second
                other.create(_reservation("interloper", "hv1"), "someone")
        return got

    monkeypatch.setattr(scheduler.transport, "txn", txn)
    seen: list[list[str]] = []
    want = _reservation("mine", "hv1")

    def check(h: Hypervisor, others: list[Reservation]) -> None:
        seen.append(sorted(o.name for o in others))
        fits(h, others, want)

    with pytest.raises(DoesNotFit):
        scheduler.claim(want, "scheduler", check)
    # The first chunk, the second refused (the set moved), then all 8 from the start.
    assert reads == [3, 3, 3, 3, 2]
    assert seen == [sorted(["interloper", *(f"r{i}" for i in range(7))])]


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
