"""What a replica keeps of the writes it follows, so a renewal that went
through another replica is at hand here (`EtcdStore`'s `FollowedValues`), and
the event loop's etcd connections (`EtcdTransport.post_async`'s idle pool).

`FollowedValues` is tested alone (hypothesis: any sequence of followed puts
and deletes, any budget), then two stores over the session's real etcd, each
with its feed running as a server's does: one store's writes are at hand on
the other once followed, a stale one never wins the compare-and-swap."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.etcd_local import EtcdCluster
from tests.support.loops import run_on_own_thread

from hvfleet.model.lease import Lease, renewed
from hvfleet.store import etcd_transport
from hvfleet.store.base import StaleVersion, WatchEvent
from hvfleet.store.etcd import FOLLOWED_KINDS, EtcdStore, FollowedValues
from hvfleet.store.etcd_transport import KeyValue, op_get
from hvfleet.store.ownership import agent_manager

PREFIXES = ["/p/objects/Lease/", "/p/objects/Hypervisor/"]
KEYS = [*(p + n for p in PREFIXES for n in ("a", "b", "c")), "/p/objects/Reservation/a", "/p/other/a"]

followed_events = st.lists(
    st.tuples(st.sampled_from(KEYS), st.binary(max_size=40), st.booleans()), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events=followed_events, budget=st.integers(0, 200), replayed=st.integers(0, 60))
def test_followed_values_answer_only_the_value_at_its_revision_within_the_budget(
        events: list[tuple[str, bytes, bool]], budget: int, replayed: int) -> None:
    """Whatever is followed (puts and deletes at rising revisions, values of any
    size, then the first `replayed` of them again, as a feed started again from
    further back sends them) and however small the budget: a key of another
    kind is never kept; the bytes held stay within the budget and are counted
    exactly; a value is answered only at the revision it was written at, never
    for a deleted key's revision; and before any replay, only while it is the
    key's latest."""
    kept = FollowedValues(PREFIXES, budget)
    written: dict[tuple[str, int], bytes] = {}  # (key, revision) -> the value put there
    latest: dict[str, int] = {}  # key -> revision of its last put or delete

    def check(only_latest: bool) -> None:
        held = 0
        for key in KEYS:
            for revision in range(len(events) + 2):
                answer = kept.value_at(key, revision)
                if answer is None:
                    continue
                assert key.startswith(tuple(PREFIXES))
                assert written[key, revision] == answer
                if only_latest:
                    assert latest[key] == revision
                held += len(answer)
        assert held == kept.held <= budget

    # A delete comes as the watch hands it on: version 0, the value before it.
    followed = [KeyValue(key, value, revision, 1, 0 if deleted else 1)
                for revision, (key, value, deleted) in enumerate(events, start=1)]
    for kv in followed:
        kept.record(kv)
        latest[kv.key] = kv.mod_revision
        if kv.version:
            written[kv.key, kv.mod_revision] = kv.value
        assert 0 <= kept.held <= budget
    check(only_latest=True)
    for kv in followed[:replayed]:
        kept.record(kv)
    check(only_latest=False)


def test_a_feed_started_again_from_further_back_leaves_the_newer_value_kept() -> None:
    kept = FollowedValues(PREFIXES, 100)
    key = PREFIXES[0] + "a"
    kept.record(KeyValue(key, b"new", 5, 1, 2))
    kept.record(KeyValue(key, b"old", 3, 1, 1))  # the same key's event at an older revision, sent again
    assert (kept.value_at(key, 5), kept.value_at(key, 3), kept.held) == (b"new", None, 3)


@pytest.fixture
def two_stores(etcd_session: EtcdCluster) -> Iterator[list[EtcdStore]]:
    """Two stores over one prefix (two replicas), each with its feed running
    as a server's is (a long-lived shared watch joined)."""
    prefix = f"/t-{uuid.uuid4().hex[:12]}"
    stores = [EtcdStore(etcd_session.endpoints, prefix) for _ in range(2)]
    stop = threading.Event()
    seen: list[list[WatchEvent]] = [[], []]
    threads = []
    for store, events in zip(stores, seen, strict=True):
        store.share_watches()
        since = store.revision()
        t = threading.Thread(target=store.watch_into, args=(None, since, events.extend, stop), daemon=True)
        t.start()
        threads.append(t)
    yield stores
    stop.set()
    for store in stores:
        store.close()
    for t in threads:
        t.join(timeout=5)


def _followed(store: EtcdStore, kind: str, name: str, revision: int) -> Any:
    """The object at `revision` once `store` has it at hand (its feed followed it)."""
    end = time.monotonic() + 10
    while (got := store.at_hand(kind, name, str(revision))) is None:
        assert time.monotonic() < end, f"{kind} {name} at {revision} never came to hand"
        time.sleep(0.005)
    return got


def test_a_write_through_one_store_is_at_hand_on_the_other_and_a_stale_one_never_wins(
        two_stores: list[EtcdStore]) -> None:
    a, b = two_stores
    holder, start = agent_manager("hv-f"), datetime.now(UTC)
    assert "Lease" in FOLLOWED_KINDS
    first = a.create(renewed(None, "hv-f", holder, 30, start), holder)
    rv1 = int(first.metadata.resource_version)
    on_b = _followed(b, "Lease", "hv-f", rv1)
    assert on_b == first and on_b.to_json() == first.to_json()

    async def renew(store: EtcdStore, current: Any, seconds: int) -> Any:
        return await store.update_on_loop(
            current, renewed(current, "hv-f", holder, 30, start + timedelta(seconds=seconds)), holder)

    second = run_on_own_thread(renew(b, on_b, 10))
    assert second == a.get("Lease", "hv-f")
    # `first` is still at hand on both (a wrote it, b followed it) but it moved
    # on: the transaction's compare on mod_revision refuses it on either.
    for store in (a, b):
        with pytest.raises(StaleVersion, match="is stale"):
            run_on_own_thread(renew(store, first, 20))
    assert a.get("Lease", "hv-f") == second
    # And back: a's write over the version it followed from b is at hand on b.
    on_a = _followed(a, "Lease", "hv-f", int(second.metadata.resource_version))
    third = run_on_own_thread(renew(a, on_a, 30))
    assert _followed(b, "Lease", "hv-f", int(third.metadata.resource_version)) == third
    a.delete("Lease", "hv-f")
    assert a.revision() > int(third.metadata.resource_version)


# Each example renews a Lease of its own name: the stores are shared, not reset.
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 1), st.booleans()), min_size=1, max_size=8))
def test_renewals_spread_over_two_stores_succeed_exactly_when_they_name_the_current_version(
        two_stores: list[EtcdStore], steps: list[tuple[int, bool]]) -> None:
    """An agent renews through either store (`step[0]`); sometimes another
    writer renews first without the agent knowing (`step[1]`). Whatever a store
    has at hand, a renewal naming the current version succeeds and one naming
    a version that moved on is StaleVersion and writes nothing."""
    name = f"hv-{uuid.uuid4().hex[:8]}"
    holder, start = agent_manager(name), datetime.now(UTC)
    known = two_stores[0].create(renewed(None, name, holder, 30, start), holder)
    assert isinstance(known, Lease)
    for i, (via, interloper) in enumerate(steps, start=1):
        store = two_stores[via]
        at = start + timedelta(seconds=10 * i)
        if interloper:
            two_stores[1 - via].update(renewed(two_stores[1 - via].get("Lease", name), name, holder, 30, at),
                                       holder)
        before = store.get("Lease", name)
        if interloper:
            with pytest.raises(StaleVersion):
                _renew(store, known, at)
            assert store.get("Lease", name) == before and isinstance(before, Lease)
            known = before
        else:
            known = _renew(store, known, at)
            assert known == store.get("Lease", name)


def _renew(store: EtcdStore, known: Lease, at: datetime) -> Lease:
    """A renewal of `known` through `store`, as a server makes it: on an event
    loop over the object at hand, else in a thread (`update`, which reads)."""
    name, holder = known.metadata.name, agent_manager(known.metadata.name)
    current = store.at_hand("Lease", name, known.metadata.resource_version)
    if current is None:
        out = store.update(renewed(known, name, holder, 30, at), holder)
    else:
        assert current == known  # at hand means exactly the object at that version

        async def renew() -> Any:
            return await store.update_on_loop(current, renewed(current, name, holder, 30, at), holder)

        out = run_on_own_thread(renew())
    assert isinstance(out, Lease)
    return out


def _sockets_to(port: int) -> int:
    """This process's TCP connections to `port` (its fds' socket inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01" and fields[9] in inodes:
                count += 1
    return count


@pytest.fixture
def etcd_alone(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A member of its own: no other connection of this process counts against it."""
    with EtcdCluster(tmp_path / "etcd", size=1) as cluster:
        yield cluster


def test_the_event_loop_keeps_a_bounded_number_of_idle_etcd_connections(etcd_alone: EtcdCluster) -> None:
    """A burst of requests in flight at once on one event loop opens a
    connection each; once it is over, ASYNC_IDLE_KEPT stay open for the next
    requests (reused, no new ones) and the rest are closed."""
    transport = etcd_transport.EtcdTransport(etcd_alone.endpoints, etcd_alone.url())
    port = int(etcd_alone.endpoints[0].rpartition(":")[2])
    burst = etcd_transport.ASYNC_IDLE_KEPT * 3
    key = f"/t-{uuid.uuid4().hex[:12]}/k"

    async def requests() -> tuple[int, int, int, int]:
        before = _sockets_to(port)
        during: list[int] = []

        async def one() -> None:
            await transport.txn_async([], [op_get(key)], [], "read")
            during.append(_sockets_to(port))

        await asyncio.gather(*(one() for _ in range(burst)))
        await asyncio.sleep(0.2)  # closed writers finish closing
        after = _sockets_to(port)
        await asyncio.gather(*(one() for _ in range(etcd_transport.ASYNC_IDLE_KEPT)))
        again = _sockets_to(port)
        return before, max(during), after, again

    try:
        before, peak, after, again = run_on_own_thread(requests())
    finally:
        transport.close()
    assert peak - before == burst  # one connection per request in flight
    assert after - before == etcd_transport.ASYNC_IDLE_KEPT  # the rest closed
    assert again == after  # the kept ones served the next requests
