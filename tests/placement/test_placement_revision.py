"""A Placement request over etcd asks etcd its revision before it reads, so
that it sees every write acknowledged before it arrived, on any replica. The
requests asking at the same time share that read (`edge.SharedRevision`):
a caller takes only a read begun after it asked, a lone caller begins its
own at once, and callers that ask while a read is under way are all
answered by the next one. Then the real thing: concurrent writers and
readers on two replicas over one etcd, every read seeing the write made
before it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from hvfleet.server.placement.edge import SharedRevision
from tests.placement.support import Placement
from tests.placement.test_placement_reads import _ok, _replicas
from tests.support.etcd_local import EtcdCluster


class Revisions:
    """A store's revision as a read of it sees it: the value when the read
    begins, answered once `gate` opens (a round trip held open at will)."""

    def __init__(self) -> None:
        self.value = 0
        self.reads = 0
        self.gate = threading.Event()
        self.gate.set()
        self.begun = threading.Event()

    def read(self) -> int:
        self.reads += 1
        seen = self.value
        self.begun.set()
        assert self.gate.wait(10)
        return seen


def test_a_lone_caller_reads_at_once_every_time() -> None:
    revisions = Revisions()
    shared = SharedRevision(revisions.read)
    got = []
    for _ in range(5):
        revisions.value += 1  # a write, acknowledged before the next call
        got.append(shared.revision())
    assert got == [1, 2, 3, 4, 5] and revisions.reads == 5


def test_callers_during_a_read_never_take_it_and_share_the_next() -> None:
    revisions = Revisions()
    shared = SharedRevision(revisions.read)
    revisions.gate.clear()
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(shared.revision)
        assert revisions.begun.wait(10)  # read 1 is under way, it saw revision 0
        revisions.value = 7  # a write acknowledged after read 1 began, before the others ask
        later = [pool.submit(shared.revision) for _ in range(6)]
        time.sleep(0.2)  # every one of them is waiting (none may take read 1)
        assert revisions.reads == 1
        revisions.gate.set()
        assert first.result(10) == 0
        assert [f.result(10) for f in later] == [7] * 6
    assert revisions.reads == 2  # read 1, and one read for the six that asked during it


def test_a_failed_read_fails_its_callers_and_the_next_caller_reads_again() -> None:
    calls = []

    def read() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("etcd: connection refused")
        return 42

    shared = SharedRevision(read)
    with pytest.raises(ConnectionError):
        shared.revision()
    assert shared.revision() == 42


@pytest.fixture(scope="module")
def etcd_replicas(etcd_session: EtcdCluster) -> Iterator[tuple[Placement, Placement]]:
    yield from _replicas(etcd_session.url(prefix=f"/revision-{uuid.uuid4().hex[:12]}"))


def test_concurrent_reads_on_either_replica_see_each_write_made_before_them(
        etcd_replicas: tuple[Placement, Placement]) -> None:
    """Eight clients, each writing its own provider's inventory through one
    replica and reading it back at once through both, all at the same time:
    the reads of each replica share their revision reads, and none misses
    the write its client made before it."""
    a, b = etcd_replicas
    providers = [str(uuid.uuid4()) for _ in range(8)]
    for rp in providers:
        _ok(a.call("POST", "/resource_providers", body={"name": rp, "uuid": rp}))

    def client(i: int) -> int:
        rp, checked = providers[i], 0
        for k in range(1, 7):
            writer = (a, b)[(i + k) % 2]
            g = _ok(writer.call("GET", f"/resource_providers/{rp}"))["generation"]
            _ok(writer.call("PUT", f"/resource_providers/{rp}/inventories", body={
                "resource_provider_generation": g, "inventories": {"DISK_GB": {"total": 100 * i + k}}}))
            for replica in (b, a):
                got = _ok(replica.call("GET", f"/resource_providers/{rp}/inventories"))
                assert got["inventories"]["DISK_GB"]["total"] == 100 * i + k, (i, k)
                checked += 1
        return checked

    with ThreadPoolExecutor(len(providers)) as pool:
        assert sum(pool.map(client, range(len(providers)))) == 8 * 6 * 2
