"""The etcd backend on a real 3-member cluster under faults.

Each test starts its own cluster on 127.0.0.1 free ports (data in tmp_path)
and stops every member it started. Writers use the store's own retries; a
caller only ever sees Unavailable (then it retries), never a lost or doubled
write. A watcher runs through each fault and must see every write exactly
once, in revision order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.etcd_local import EtcdCluster, EtcdMember

from hvfleet.model import AlreadyExists, Hypervisor, Unavailable
from hvfleet.store.base import WatchEvent
from hvfleet.store.etcd import EtcdStore

WRITES = 2000
WRITERS = 4


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path / "cluster", size=3) as c:
        yield c


def _hypervisor(i: int) -> Hypervisor:
    return Hypervisor.model_validate(
        {"metadata": {"name": f"hv-{i:05d}", "labels": {"seq": str(i), "rack": f"r{i % 40}"}}}
    )


def _endpoints_starting_with(cluster: EtcdCluster, first: EtcdMember) -> list[str]:
    return [first.endpoint] + [m.endpoint for m in cluster.members if m is not first]


class _Watcher:
    """Collects every Hypervisor event from `since` in a thread."""

    def __init__(self, store: EtcdStore, since: int) -> None:
        self.events: list[WatchEvent] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(store, since))
        self._thread.start()

    def _run(self, store: EtcdStore, since: int) -> None:
        try:
            for e in store.watch("Hypervisor", since=since, stop=self.stop):
                self.events.append(e)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < count and time.monotonic() < deadline and self.error is None:
            time.sleep(0.05)
        self.stop.set()
        self._thread.join(10)


def _write_all(store: EtcdStore, fault: threading.Event, fault_at: int) -> list[str]:
    """Create WRITES hypervisors from WRITERS threads; set `fault` half-way. Returns
    the errors callers saw (each was retried)."""
    done = 0
    lock = threading.Lock()
    seen_errors: list[str] = []

    def writer(t: int) -> None:
        nonlocal done
        for i in range(t, WRITES, WRITERS):
            failed_before = False
            while True:
                try:
                    store.create(_hypervisor(i), "loader")
                    break
                except Unavailable as exc:
                    with lock:
                        seen_errors.append(str(exc))
                    failed_before = True
                except AlreadyExists:
                    # Only acceptable if an earlier attempt of this very write was
                    # cut off and then did land; the final check proves the content.
                    assert failed_before, f"hv-{i:05d} existed before its first write"
                    break
            with lock:
                done += 1
                if done == fault_at:
                    fault.set()

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
        assert not th.is_alive(), "a writer hung"
    return seen_errors


def _assert_all_written_once(store: EtcdStore, watcher: _Watcher) -> dict[str, str]:
    listed = store.list("Hypervisor")
    names = [h.metadata.name for h in listed.items]
    assert names == [f"hv-{i:05d}" for i in range(WRITES)], "a write was lost"
    for h in listed.items:
        assert h.metadata.labels["seq"] == str(int(h.metadata.name[3:]))
    watcher.wait_for(WRITES, timeout=30)
    assert watcher.error is None, f"watch failed: {watcher.error}"
    got = [(e.type, e.object.metadata.name) for e in watcher.events]
    assert len(got) == WRITES, f"watch saw {len(got)} events for {WRITES} writes"
    assert sorted(n for _, n in got) == names, "watch lost or repeated an event"
    assert all(t == "ADDED" for t, _ in got)
    revs = [e.revision for e in watcher.events]
    assert revs == sorted(set(revs)), "watch events out of order or repeated"
    rvs = {h.metadata.name: h.metadata.resource_version or "" for h in listed.items}
    assert {e.object.metadata.name: str(e.revision) for e in watcher.events} == rvs
    return rvs


@pytest.mark.timeout(180)
def test_follower_killed_mid_way_through_2000_writes_loses_none(cluster: EtcdCluster) -> None:
    victim = cluster.follower()
    # Both the writers and the watcher talk to the victim first: its death must
    # move them to another member without losing or repeating anything.
    endpoints = _endpoints_starting_with(cluster, victim)
    store = EtcdStore(endpoints, "/fault")
    watch_store = EtcdStore(endpoints, "/fault")
    watcher = _Watcher(watch_store, since=store.revision())
    fault = threading.Event()

    def kill_when_due() -> None:
        if fault.wait(60):
            victim.kill()

    killer = threading.Thread(target=kill_when_due)
    killer.start()
    errors = _write_all(store, fault, WRITES // 2)
    killer.join(10)
    assert not victim.running
    assert victim.endpoint not in (store.endpoint, watch_store.endpoint), "nobody failed over"
    _assert_all_written_once(store, watcher)
    assert all("127.0.0.1:" in e for e in errors), errors  # errors name an endpoint
    # The member comes back and catches up.
    victim.start()
    cluster.wait_ready()
    only_victim = EtcdStore([victim.endpoint], "/fault")
    assert len(only_victim.list("Hypervisor").items) == WRITES
    for s in (store, watch_store, only_victim):
        s.close()


@pytest.mark.timeout(180)
def test_leader_killed_mid_way_loses_none_and_restart_keeps_versions(
    cluster: EtcdCluster,
) -> None:
    leader = cluster.leader()
    assert leader is not None
    endpoints = _endpoints_starting_with(cluster, leader)
    store = EtcdStore(endpoints, "/fault")
    watch_store = EtcdStore(endpoints, "/fault")
    watcher = _Watcher(watch_store, since=store.revision())
    fault = threading.Event()
    new_leader: list[str] = []

    def kill_when_due() -> None:
        if fault.wait(60):
            leader.kill()
            cluster.wait_ready(timeout=20)
            new = cluster.leader()
            new_leader.append(new.name if new else "")

    killer = threading.Thread(target=kill_when_due)
    killer.start()
    _write_all(store, fault, WRITES // 2)
    killer.join(30)
    assert new_leader and new_leader[0] not in ("", leader.name), "no re-election"
    assert leader.endpoint not in (store.endpoint, watch_store.endpoint), "nobody failed over"
    rvs = _assert_all_written_once(store, watcher)
    store.close()
    watch_store.close()

    # Stop and restart every member (SIGKILL: acknowledged writes were fsynced).
    leader.start()
    cluster.wait_ready()
    cluster.kill_all()
    cluster.start()
    after = EtcdStore(cluster.endpoints, "/fault")
    listed = after.list("Hypervisor")
    assert {h.metadata.name: h.metadata.resource_version for h in listed.items} == rvs
    # And it keeps working where it left off.
    first = listed.items[0]
    meta = first.metadata.model_copy(update={"labels": {**first.metadata.labels, "after": "restart"}})
    updated = after.update(first.model_copy(update={"metadata": meta}), "loader")
    assert int(updated.metadata.resource_version or 0) > max(int(v) for v in rvs.values())
    after.close()


@pytest.mark.timeout(60)
def test_watch_on_a_member_that_lost_its_leader_fails_instead_of_going_silent(
    cluster: EtcdCluster,
) -> None:
    """Without the require-leader flag, a watch on a member cut off from the rest
    would just see no more events; it must end and say why."""
    lonely = cluster.members[0]
    store = EtcdStore([lonely.endpoint], "/lonely", unavailable_after=3)
    errors: list[BaseException] = []
    ended = threading.Event()

    def watch() -> None:
        try:
            for _ in store.watch("Hypervisor", since=store.revision()):
                pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            ended.set()

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(0.5)
    for m in cluster.members[1:]:
        m.kill()
    killed_at = time.monotonic()
    assert ended.wait(20), "the watch went silent"
    t.join(5)
    # etcd cancels it after its election timeout; the watch then retries for 3 s.
    assert time.monotonic() - killed_at < 12
    assert len(errors) == 1 and isinstance(errors[0], Unavailable), errors
    assert "no leader" in str(errors[0]) and lonely.endpoint in str(errors[0])
    store.close()
