"""Allocation writes that arrive together are written together
(hvfleet.placement.allocations.AllocationWriter): concurrent PUTs on one
provider wait for each other inside the server instead of losing a
compare-and-swap and coming back as 409s, each request is answered with its
own result, and the guarantees stay: 0 overbooked, across replicas too."""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvfleet.model.placement import ResourceProvider
from hvfleet.placement.allocations import AllocationWriter, ConsumerRequest
from hvfleet.placement.errors import PlacementBadRequest, PlacementConflict
from hvfleet.placement.records import Source
from hvfleet.placement.service import create_provider, set_inventories
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.store import Store, open_store
from tests.placement.support import (
    Placement,
    _fleet,
    _race,
    _serve,
    _served_sqlite,
    _stored_provider,
)
from tests.support.etcd_local import EtcdCluster


@pytest.fixture(scope="module")
def sqlite_api() -> Iterator[Placement]:
    yield from _served_sqlite()


@pytest.fixture(scope="module")
def etcd_api(etcd_session: EtcdCluster) -> Iterator[Placement]:
    d = Path(tempfile.mkdtemp())
    store = open_store(etcd_session.url(prefix=f"/grouped-{uuid.uuid4().hex[:12]}"))
    _fleet(store)
    yield from _serve(store, d)
    store.close()


@pytest.mark.parametrize("served", ["sqlite_api", "etcd_api"])
def test_eight_clients_on_one_provider_each_get_their_claim_at_the_first_try(
        served: str, request: pytest.FixtureRequest) -> None:
    """Before, all but one of the requests that read the provider's record
    together lost its compare-and-swap (409 placement.concurrent_update) and
    the client had to send it again."""
    api: Placement = request.getfixturevalue(served)
    rp = _stored_provider(api, 1000)
    answers: list[int] = []
    lock = threading.Lock()
    go = threading.Barrier(8)

    def client() -> None:
        go.wait()
        for _ in range(3):
            r = api.call("PUT", f"/allocations/{uuid.uuid4()}", "scheduler", {
                "allocations": {rp: {"resources": {"DISK_GB": 1}}}, "project_id": "p",
                "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"})
            with lock:
                answers.append(r.status_code)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [204] * 24
    usage = api.call("GET", f"/resource_providers/{rp}/usages").json()["usages"]
    assert usage == {"DISK_GB": 24}


def _race_on_two_replicas(a: Placement, b: Placement) -> None:
    rp = _stored_provider(a, 12)
    results: list[tuple[int, int]] = []
    threads = [threading.Thread(target=lambda api=api: results.append(
        _race(api, rp, "DISK_GB", 12, clients=4, per_client=3))) for api in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(won for won, _ in results) == 12
    assert b.call("GET", f"/resource_providers/{rp}/usages").json()["usages"] == {"DISK_GB": 12}


def test_two_replicas_grouping_claims_on_one_provider_never_overbook_on_etcd(
        etcd_session: EtcdCluster) -> None:
    """Each replica groups its own requests; the groups of two replicas race
    on the provider's record, and the store's compare-and-swap settles it."""
    url = etcd_session.url(prefix=f"/grouped2-{uuid.uuid4().hex[:12]}")
    first, second = open_store(url), open_store(url)
    _fleet(first)
    try:
        for a in _serve(first, Path(tempfile.mkdtemp())):
            for b in _serve(second, Path(tempfile.mkdtemp()), a.tokens):
                _race_on_two_replicas(a, b)
    finally:
        first.close()
        second.close()


class Held:
    """A writer whose first write waits (in its catch-up) until `release`,
    so that the requests sent meanwhile queue and are written as a group."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.snap = ProviderSnapshot.from_store(store)
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()
        self.plain = Source(store, self.snapshot)
        self.writer = AllocationWriter()
        self.answers: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

    def snapshot(self, catch_up: bool) -> ProviderSnapshot:
        if catch_up:
            if not self.gate.is_set():
                self.entered.set()
                self.gate.wait()
            self.snap.refresh(self.store)
        return self.snap

    def provider(self, total: int) -> str:
        rp = create_provider(self.plain, str(uuid.uuid4()), None, None).uuid
        set_inventories(self.plain, rp, 0, {"DISK_GB": {"total": total}}, False)
        return rp

    def send(self, name: str, requests: list[ConsumerRequest]) -> None:
        """`requests` (one request's) sent from a thread of their own; the
        first one sent holds the writer, the next ones queue in this order."""
        src = Source(self.store, self.snapshot, self.writer)

        def run() -> None:
            try:
                self.writer.write(src, requests)
            except Exception as exc:
                self.answers[name] = exc
            else:
                self.answers[name] = "written"

        first = not self.threads
        if first:
            self.gate.clear()
        self.threads.append(threading.Thread(target=run))
        self.threads[-1].start()
        if first:
            assert self.entered.wait(10)  # its write is under way, holding the writer
            return
        deadline = time.monotonic() + 10
        while len(self.writer._queue) < len(self.threads) - 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(self.writer._queue) == len(self.threads) - 1

    def release(self) -> dict[str, Any]:
        self.gate.set()
        for t in self.threads:
            t.join(30)
        return self.answers


def _one(consumer: str, provider: str, generation: int | None = None) -> ConsumerRequest:
    return ConsumerRequest(consumer, {provider: {"DISK_GB": 1}}, "p", "u", generation, True)


def test_a_group_answers_each_request_with_its_own_result(tmp_path: Path) -> None:
    """Five requests queue behind a write under way and are then checked
    and written as one group: the two that fit are written in one atomic
    write, and a stale consumer generation, a request past the capacity and
    an unknown provider each get their own refusal, leaving nothing behind."""
    store = open_store(f"sqlite:///{tmp_path}/hvfleet.db")
    held = Held(store)
    rp = held.provider(3)
    held.send("a", [_one(str(uuid.uuid4()), rp)])
    queued = {"b": _one(str(uuid.uuid4()), rp), "stale": _one(str(uuid.uuid4()), rp, generation=7),
              "d": _one(str(uuid.uuid4()), rp), "full": _one(str(uuid.uuid4()), rp),
              "unknown": _one(str(uuid.uuid4()), str(uuid.uuid4()))}
    for name, req in queued.items():  # in this order: "full" comes after a, b and d took the 3
        held.send(name, [req])
    answers = held.release()
    assert {k: v for k, v in answers.items() if v == "written"} == dict.fromkeys("abd", "written")
    assert isinstance(answers["stale"], PlacementConflict) and "generation" in answers["stale"].detail
    assert isinstance(answers["full"], PlacementConflict) and "capacity" in answers["full"].detail
    assert isinstance(answers["unknown"], PlacementBadRequest)
    assert (held.writer.groups, held.writer.grouped) == (1, 2)  # b and d: one write
    record = store.get("ResourceProvider", rp)
    assert isinstance(record, ResourceProvider)
    assert sum(r["DISK_GB"] for r in record.spec.allocations.values()) == 3
    consumers = {c.name for c in store.list("PlacementConsumer").items}
    assert consumers == set(record.spec.allocations)
    assert {queued["b"].consumer, queued["d"].consumer} < consumers and len(consumers) == 3
    store.close()


def test_a_group_too_large_for_one_etcd_transaction_is_written_request_by_request(
        etcd_session: EtcdCluster) -> None:
    """Four POST /allocations of 40 consumers each fit one etcd transaction
    (--max-txn-ops 128) alone but not together: each is then written on its
    own, and none is refused for what the others asked."""
    store = open_store(etcd_session.url(prefix=f"/grouped3-{uuid.uuid4().hex[:12]}"))
    held = Held(store)
    rp = held.provider(1000)
    held.send("first", [_one(str(uuid.uuid4()), rp)])
    for k in range(4):
        held.send(f"post{k}", [_one(str(uuid.uuid4()), rp) for _ in range(40)])
    answers = held.release()
    assert answers == {"first": "written", **{f"post{k}": "written" for k in range(4)}}
    assert held.writer.groups == 0
    record = store.get("ResourceProvider", rp)
    assert isinstance(record, ResourceProvider)
    assert len(record.spec.allocations) == 161
    store.close()
