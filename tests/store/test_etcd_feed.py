"""The etcd backend's shared feed (store/feed.py): a process's long-lived
watches read one etcd stream, and each sees what its own stream would have
given it — every event of its range once, in order, each revision's last
one marked — also when it starts from before what the feed holds.

Uses the session's real etcd (conftest.etcd_session).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.store.watching import Seen, Watching, seen_of
from tests.support.etcd_local import EtcdCluster

from hvfleet.model import Gone, Hypervisor, InvalidInput, Reservation
from hvfleet.model.lease import renewed
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.scheduling.index import FleetIndex
from hvfleet.store import feed as etcd_feed
from hvfleet.store import lifecycle
from hvfleet.store.base import WatchEvent, Write
from hvfleet.store.errors import Undecodable
from hvfleet.store.etcd import EtcdStore
from hvfleet.store.etcd_watch import _within, chunked_lines
from hvfleet.store.feed import Interest, Item, Progress, _for
from hvfleet.store.tokens import issue_token

MakeHv = Callable[..., Hypervisor]
def _streams() -> int:
    """etcd streams open in this process: one reader thread each, or the feed's
    own thread, which reads its stream itself."""
    return len([t for t in threading.enumerate() if t.name.startswith(("etcd-watch-", "etcd-feed"))])


def _own(store: EtcdStore, kind: str | None, since: int, name: str | None = None) -> list[Seen]:
    """What the watch's own etcd stream gives (a watch with a timeout reads one)."""
    return [seen_of(e) for e in store.watch(kind, since=since, name=name, timeout=1.0)]


@pytest.fixture
def etcd(etcd_session: EtcdCluster) -> Iterator[EtcdStore]:
    store = EtcdStore(etcd_session.endpoints, f"/t-{uuid.uuid4().hex[:12]}")
    store.share_watches()
    yield store
    store.close()


def _writes(store: EtcdStore, make_hypervisor: MakeHv, tag: str) -> int:
    """Hypervisors, Leases and one atomic write of both; how many objects written."""
    now = datetime.now(UTC)
    for i in range(3):
        store.create(make_hypervisor(f"{tag}{i}"), "op")
        store.create(renewed(None, f"{tag}{i}", f"agent/{tag}{i}", 30, now), f"agent/{tag}{i}")
    agent = f"agent/{tag}-batch"  # an agent registering its host and taking its Lease at once
    store.write_all([Write("create", make_hypervisor(f"{tag}-batch")),
                     Write("create", renewed(None, f"{tag}-batch", agent, 30, now))], agent)
    store.delete("Hypervisor", f"{tag}1")
    return 9


def test_the_long_lived_watches_of_a_process_share_one_stream_and_see_what_their_own_would(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    since = etcd.revision()
    watches = [Watching(etcd, "Hypervisor", since), Watching(etcd, None, since),
               Watching(etcd, "Lease", since), Watching(etcd, "Hypervisor", since, name="a2")]
    try:
        _writes(etcd, make_hypervisor, "a")
        expected = [_own(etcd, "Hypervisor", since), _own(etcd, None, since), _own(etcd, "Lease", since),
                    _own(etcd, "Hypervisor", since, "a2")]
        assert [len(x) for x in expected] == [5, 9, 4, 1]
        # The atomic write is one revision: the all-kinds watch sees it end at its
        # Lease, a Hypervisor watch at its Hypervisor.
        assert [s[4] for s in expected[1] if "batch" in s[2]] == [False, True]
        for w, want in zip(watches, expected, strict=True):
            assert w.until(len(want)) == want and not w.errors
        assert _streams() == 1  # the feed's; each watch with a timeout above closed its own
    finally:
        for w in watches:
            w.close()


def test_a_process_that_did_not_share_its_watches_keeps_a_stream_per_watch(
    etcd_session: EtcdCluster, make_hypervisor: MakeHv
) -> None:
    """An agent watching its own Hypervisor must not receive every write of the
    fleet: only a server says it shares its watches."""
    store = EtcdStore(etcd_session.endpoints, f"/t-{uuid.uuid4().hex[:12]}")
    try:
        since = store.revision()
        mine = Watching(store, "Hypervisor", since, name="d1")
        store.create(make_hypervisor("d0"), "op")
        store.create(make_hypervisor("d1"), "op")
        assert [s[2] for s in mine.until(1)] == ["d1"]
        assert store._feed.position == 0  # the shared stream never started
        mine.close()
    finally:
        store.close()


def test_a_watch_from_before_what_the_feed_holds_catches_up_on_its_own_stream_then_joins(
    etcd_session: EtcdCluster, make_hypervisor: MakeHv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(etcd_feed, "FEED_KEPT", 3)
    store = EtcdStore(etcd_session.endpoints, f"/t-{uuid.uuid4().hex[:12]}")
    store.share_watches()
    try:
        since = store.revision()
        first = Watching(store, None, since)  # starts the feed at `since`
        total = _writes(store, make_hypervisor, "b")
        assert len(first.until(total)) == total
        assert store._feed.horizon > since  # the feed holds only the last few events
        late = Watching(store, None, since)
        total += _writes(store, make_hypervisor, "c")  # while it catches up
        want = _own(store, None, since)
        assert len(want) == total
        assert late.until(total) == want and not late.errors
        # Caught up, it joined the feed and closed its own stream.
        assert _streams() == 1
        assert first.until(total) == want
        first.close()
        late.close()
    finally:
        store.close()


def test_a_shared_watch_from_a_compacted_revision_is_gone(tmp_path: Path, make_hypervisor: MakeHv) -> None:
    # Its own member: compaction is cluster-wide and would take history from other tests.
    with EtcdCluster(tmp_path / "compact", size=1) as cluster:
        store = EtcdStore(cluster.endpoints, "/compact")
        store.share_watches()
        start = store.revision()
        for i in range(3):
            store.create(make_hypervisor(f"hv{i}"), "op")
        store.compact(store.revision())
        stop = threading.Event()
        threading.Timer(10, stop.set).start()
        with pytest.raises(Gone, match=f"revision {start} was compacted"):
            list(store.watch("Hypervisor", since=start, stop=stop))
        # The feed starts again for the next watch, at its revision.
        since = store.revision()
        w = Watching(store, "Hypervisor", since)
        store.create(make_hypervisor("hv9"), "op")
        assert [s[2] for s in w.until(1)] == ["hv9"]
        w.close()
        stop.set()
        store.close()


@given(st.lists(st.tuples(st.integers(1, 4), st.sampled_from(["Hypervisor", "Lease", "AccessToken"]),
                          st.sampled_from(["a", "b"])), max_size=12),
       st.sampled_from([Interest(None), Interest("Hypervisor"), Interest("Lease"), Interest("AccessToken"),
                        Interest("Hypervisor", "a")]),
       st.booleans())
def test_a_watch_sees_its_own_events_of_a_group_with_each_revisions_last_marked(
        raw: list[tuple[int, str, str]], interest: Interest, progress: bool) -> None:
    """What the feed hands a watch (`_for`) is what a stream of the watch's own
    range gives: its events in the same order, last_of_revision where its
    range's part of a revision ends. (Access tokens, here undecodable ones,
    are in no all-kinds watch.) A watch that takes progress is handed each
    revision with nothing of its own as one Progress, in its place: a reader
    waiting for that revision (a claim on a stored Placement provider writes
    no kind the fleet index follows) is not left to wait out its bound."""
    interest = dataclasses.replace(interest, progress=progress)
    raw = sorted(raw, key=lambda r: r[0])
    now = datetime.now(UTC)
    group: list[Item] = []
    for at, (rev, kind, name) in enumerate(raw):
        last = at + 1 == len(raw) or raw[at + 1][0] != rev
        if kind == "AccessToken":
            group.append(Undecodable(kind, name, rev, "not this model"))
        else:
            obj = (Hypervisor.model_validate({"metadata": {"name": name}}) if kind == "Hypervisor"
                   else renewed(None, name, "agent/x", 30, now))
            group.append(WatchEvent("MODIFIED", obj, rev, last_of_revision=last))

    def key(i: Item) -> tuple[str, str, int]:
        if isinstance(i, Progress):
            return "", "", i.revision
        if isinstance(i, Undecodable):
            return i.kind, i.name, i.revision
        return i.object.kind, i.object.metadata.name, i.revision

    got = _for(interest, group)
    want: list[tuple[str, str, int]] = []
    for rev in sorted({r[0] for r in raw}):
        own = [key(i) for i in group if i.revision == rev and (
            (interest.kind is None and key(i)[0] != "AccessToken")
            or (interest.kind == key(i)[0] and interest.name in (None, key(i)[1])))]
        want += own or ([("", "", rev)] if progress else [])
    assert [key(i) for i in got] == want
    for at, item in enumerate(got):
        if isinstance(item, WatchEvent):
            assert item.last_of_revision == (at + 1 == len(got) or got[at + 1].revision != item.revision)


def test_a_watch_into_the_feed_is_handed_each_revision_on_the_feeds_thread_as_its_own_stream_gives(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    """The API's fan-outs take their events on the feed's own thread (no thread
    of theirs woken per event), a revision at a time, and the feed reads its
    etcd stream itself (no reader thread before it)."""
    since = etcd.revision()
    got: list[tuple[str, list[Seen]]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            etcd.watch_into("Hypervisor", since, lambda evs: got.append(
                (threading.current_thread().name, [seen_of(e) for e in evs])), stop)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        _writes(etcd, make_hypervisor, "w")
        want = _own(etcd, "Hypervisor", since)
        deadline = time.monotonic() + 15
        while sum(len(evs) for _, evs in got) < len(want) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [s for _, evs in got for s in evs] == want and not errors
        assert {name for name, _ in got} == {"etcd-feed"}
        # One list per revision, each ending at its revision's last event.
        assert all(evs[-1][4] and len({s[3] for s in evs}) == 1 for _, evs in got)
        assert _streams() == 1 and not [x for x in threading.enumerate() if x.name.startswith("etcd-watch-")]
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


def test_the_placement_snapshot_follows_the_processs_one_stream(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    """`watch_objects` without a timeout (the Placement snapshot's follower) is
    served by the feed: every stored kind, tokens and Placement records too,
    as its own stream gives them, and no second etcd stream."""
    since = etcd.revision()
    seen: list[Seen] = []
    stop = threading.Event()

    def run() -> None:
        for e in etcd.watch_objects(since, stop=stop):
            seen.append(seen_of(e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    snap = ProviderSnapshot.from_store(etcd)
    snap.follow(etcd, stop)
    try:
        _writes(etcd, make_hypervisor, "p")
        issue_token(etcd, "viewer", manager="test", now=datetime.now(UTC), ttl=timedelta(hours=1),
                    name="feed-viewer")
        want = list(etcd.watch_objects(since, timeout=1.0))
        assert "AccessToken" in {e.object.kind for e in want}
        deadline = time.monotonic() + 15
        while len(seen) < len(want) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen == [seen_of(e) for e in want]
        assert _streams() == 1
        snap.refresh(etcd)
        assert snap.host_provider("p0") is not None and snap.host_provider("p1") is None  # p1 deleted
    finally:
        stop.set()
        t.join(5)


def test_the_garbage_collector_on_the_feed_wakes_only_for_what_can_concern_it(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    """Status writes of objects with no owner reach the collector's worker not
    at all; an owner's deletion still has its dependents collected."""
    woken: list[int] = []

    class Counted(queue.SimpleQueue[Any]):
        def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
            woken.append(1)
            super().put(item, block, timeout)

    collector = lifecycle.GarbageCollector(etcd)
    collector._work = Counted()
    collector.start()
    try:
        owner = etcd.create(make_hypervisor("gc-owner"), "op")
        ref = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "name": "gc-owner",
               "uid": owner.metadata.uid}
        etcd.create(Reservation.model_validate({
            "metadata": {"name": "gc-dep", "ownerReferences": [ref]},
            "spec": {"hypervisor": "gc-owner", "resources": {"cpu": 1}, "consumer": "gc-dep"}}), "op")
        deadline = time.monotonic() + 10
        while len(woken) < 2 and time.monotonic() < deadline:  # the sweep, the dependent
            time.sleep(0.02)
        before = len(woken)
        for i in range(20):
            etcd.create(renewed(None, f"gc-l{i}", f"agent/gc-l{i}", 30, datetime.now(UTC)), f"agent/gc-l{i}")
        etcd.update_hypervisor("gc-owner", lambda h: h.model_copy(update={"metadata": h.metadata.model_copy(
            update={"labels": {"x": "y"}})}), "op")
        marker = etcd.create(make_hypervisor("gc-marker"), "op")
        etcd.delete("Hypervisor", "gc-marker")  # a deletion: passed on, and marks the end
        deadline = time.monotonic() + 10
        while len(woken) == before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(woken) == before + 1 and marker.metadata.name == "gc-marker"
        etcd.delete("Hypervisor", "gc-owner")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                etcd.get("Reservation", "gc-dep")
            except Exception:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the dependent was not collected")
    finally:
        collector.close()


def test_a_write_beside_the_objects_reaches_a_follower_as_progress_in_order(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    """The feed follows every key of the store: a server secret's write (the
    history sampler's turn) comes to `watch_objects`' `on_progress` between the
    events around it, dropped before any decode; a Reservation's write (with
    its index and set keys, one revision) stays one event, its revision's last."""
    since = etcd.revision()
    seen: list[tuple[str, int, bool]] = []
    stop = threading.Event()

    def run() -> None:
        for e in etcd.watch_objects(since, stop=stop,
                                    on_progress=lambda r: seen.append(("progress", r, True))):
            seen.append((e.object.kind, e.revision, e.last_of_revision))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        a = etcd.create(make_hypervisor("pr-a"), "op")
        assert etcd.put_server_secret("pr-secret", b"1", None)
        secret = etcd.server_secret("pr-secret")
        assert secret is not None
        r = etcd.create(Reservation.model_validate({
            "metadata": {"name": "pr-r"}, "spec": {"hypervisor": "pr-a", "resources": {"cpu": 1},
                                                    "consumer": "pr-r"}}), "op")
        assert etcd.put_server_secret("pr-secret", b"2", secret[1])
        etcd.create(make_hypervisor("pr-b"), "op")
        end = etcd.revision()
        want = [("Hypervisor", int(a.metadata.resource_version or 0), True), ("progress", secret[1], True),
                ("Reservation", int(r.metadata.resource_version or 0), True),
                ("progress", end - 1, True), ("Hypervisor", end, True)]
        deadline = time.monotonic() + 15
        while len(seen) < len(want) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen == want
        assert etcd._feed.position == end
    finally:
        stop.set()
        t.join(5)


_KEYS = st.sampled_from(["/p/objects/Hypervisor/a", "/p/objects/Lease/b", "/p/server-secrets/s",
                         "/p/reservation-sets/a", "/p/reservation-index/a/r"])


@given(st.lists(st.tuples(st.integers(1, 6), _KEYS), max_size=14))
def test_the_stream_keeps_the_objects_events_and_marks_each_revision_without_one(
        raw: list[tuple[int, str]]) -> None:
    """`_within` (what the feed's stream keeps of one etcd message): the
    events on object keys, in order, and after the last event of each
    revision that has none of them, that revision; nothing else."""
    raw = sorted(raw, key=lambda r: r[0])  # etcd's order: by revision, a revision's events together
    events = [{"kv": {"key": base64.b64encode(k.encode()).decode(), "mod_revision": str(rev)}}
              for rev, k in raw]
    got = _within(events, b"/p/objects/")
    kept = [e for e in got if isinstance(e, dict)]
    assert kept == [e for e, (_, k) in zip(events, raw, strict=True) if k.startswith("/p/objects/")]
    having = {rev for rev, k in raw if k.startswith("/p/objects/")}
    assert [e for e in got if isinstance(e, int)] == sorted({rev for rev, _ in raw} - having)
    order = [e if isinstance(e, int) else int(e["kv"]["mod_revision"]) for e in got]
    assert order == sorted(order)  # each mark after its revision's events, before the next's


def _switches(thread: threading.Thread) -> int:
    """How many times `thread` gave up the CPU (waited) so far: /proc's count."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line for line in status.splitlines()
                    if line.startswith("voluntary_ctxt_switches:")).split()[1])


def test_an_idle_watch_on_the_feed_sleeps_until_an_event_its_stop_or_the_close(
    etcd_session: EtcdCluster, make_hypervisor: MakeHv
) -> None:
    """A joined watch's thread with nothing to do does not wake to look (it
    woke 10 times a second, a watch_into's twice), yet still ends at once when
    its stop is set, and one with no stop when the store closes."""
    store = EtcdStore(etcd_session.endpoints, f"/t-{uuid.uuid4().hex[:12]}")
    store.share_watches()
    try:
        since = store.revision()
        watches = [Watching(store, "Hypervisor", since), Watching(store, None, since),
                   Watching(store, "Lease", since)]
        stop = threading.Event()
        into = threading.Thread(target=store.watch_into, args=("Hypervisor", since, lambda evs: None, stop),
                                daemon=True)
        into.start()
        unstopped: list[str] = []

        def run_unstopped() -> None:
            for e in store.watch("Hypervisor", since=since):
                unstopped.append(e.object.metadata.name)

        forever = threading.Thread(target=run_unstopped, daemon=True)
        forever.start()
        store.create(make_hypervisor("idle0"), "op")
        assert [len(w.until(1)) for w in watches[:2]] == [1, 1] and watches[2].seen == []
        deadline = time.monotonic() + 10
        while not unstopped and time.monotonic() < deadline:
            time.sleep(0.02)
        threads = [w.thread for w in watches] + [into, forever]
        before = [_switches(t) for t in threads]
        time.sleep(1.5)
        assert all(_switches(t) - b <= 1 for t, b in zip(threads, before, strict=True))
        # Still woken by what comes: an event, a stop.
        store.create(make_hypervisor("idle1"), "op")
        assert [len(w.until(2)) for w in watches[:2]] == [2, 2] and watches[2].seen == []
        began = time.monotonic()
        for w in watches:
            w.stop.set()
        stop.set()
        for t in threads[:4]:
            t.join(2)
        assert not any(t.is_alive() for t in threads[:4]) and time.monotonic() - began < 1.0
        assert forever.is_alive()
    finally:
        began = time.monotonic()
        store.close()
    forever.join(2)
    assert not forever.is_alive() and time.monotonic() - began < 3.0


_LINES = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=8)


@given(_LINES, st.lists(st.integers(1, 50), min_size=1, max_size=20), st.booleans(), st.booleans())
def test_a_chunked_watch_body_reads_back_as_the_lines_sent_however_it_is_cut(
        lines: list[bytes], cuts: list[int], extensions: bool, ended: bool) -> None:
    """`chunked_lines` (how a watch stream's body is read): the gateway's lines,
    cut into chunks anywhere (a line over several chunks, several in one),
    come back as sent, each with its newline; a body cut off before its last
    chunk gives what it had."""
    body = b"".join(line + b"\n" for line in lines)
    wire, at, k = b"", 0, 0
    while at < len(body):
        size = cuts[k % len(cuts)]
        k += 1
        piece = body[at:at + size]
        at += size
        wire += b"%x%s\r\n%s\r\n" % (len(piece), b";x=y" if extensions else b"", piece)
    if ended:
        wire += b"0\r\n\r\n"
    got = list(chunked_lines(io.BufferedReader(io.BytesIO(wire))))
    assert got == [line + b"\n" for line in lines]


def test_a_fleet_index_refresh_after_a_write_beside_the_objects_does_not_wait_out_its_settle(
    etcd: EtcdStore, make_hypervisor: MakeHv
) -> None:
    """The server's fleet index (fit, the dashboard) catches up with the store's
    revision before each use on a stream of its own: a server secret's write
    (the history sampler's turn, every 10 s) reaches it as progress, so it
    stops there instead of waiting out its watch's catch-up grace (0.5 s each
    time before); an object write after it is still in the index."""
    etcd.create(make_hypervisor("fi0"), "op")
    index = FleetIndex.from_store(etcd)
    took = _refreshes_after(lambda i: etcd.put_server_secret(f"fi-secret-{i}", b"1", None),
                            index, etcd, make_hypervisor, "fi")
    assert sorted(took)[1] < 0.25, took


def _refreshes_after(write_beside: Callable[[int], object], index: FleetIndex, store: EtcdStore,
                     make_hypervisor: MakeHv, tag: str) -> list[float]:
    """Three times: a write that is not one of `store`'s objects, then how long
    the index's refresh took; then an object write, which the next refresh
    must have (read-after-write)."""
    took: list[float] = []
    for i in range(3):
        write_beside(i)
        began = time.monotonic()
        index.refresh(store)
        took.append(time.monotonic() - began)
        store.create(make_hypervisor(f"{tag}{i + 1}"), "op")
        index.refresh(store)
        assert index.host(f"{tag}{i + 1}") is not None
    return took


@pytest.mark.parametrize("follow", ["all", "prefix"])
def test_another_fleets_write_in_the_same_etcd_holds_up_a_read_only_when_following_the_prefix(
    etcd_session: EtcdCluster, make_hypervisor: MakeHv, follow: str
) -> None:
    """Two fleets in one etcd (`?prefix=`, docs/etcd.md): fleet A's writes move
    the revision that fleet B's readers wait for (a fit, a Placement GET: the
    index follows the feed and waits until it has seen etcd's revision).
    Following every key (`?follow=all`, the default) A's write reaches B's
    feed as progress and B's next read answers at once; following B's prefix
    only, that read waits out its 0.5 s bound. Read-after-write holds in both."""
    tag = uuid.uuid4().hex[:8]
    other = EtcdStore(etcd_session.endpoints, f"/t-a-{tag}")
    mine = EtcdStore.from_url(etcd_session.url(prefix=f"/t-b-{tag}") + f"&follow={follow}")
    assert mine.follow == follow
    mine.share_watches()
    stop = threading.Event()
    try:
        mine.create(make_hypervisor("b0"), "op")
        index = FleetIndex.from_store(mine)
        index.follow_stream(mine, stop)
        took = _refreshes_after(lambda i: other.create(make_hypervisor(f"a{i}"), "op"),  # the other fleet's
                                index, mine, make_hypervisor, "b")
        if follow == "all":
            assert sorted(took)[1] < 0.2, took
        else:
            assert sorted(took)[1] >= 0.4, took
    finally:
        stop.set()
        mine.close()
        other.close()


def test_the_follow_option_takes_all_or_prefix_and_keeps_to_the_stores_url() -> None:
    assert EtcdStore.from_url("etcd://127.0.0.1:2379").follow == "all"
    kept = EtcdStore.from_url("etcd://127.0.0.1:2379?prefix=/f&follow=prefix")
    assert kept.follow == "prefix" and kept.url == "etcd://127.0.0.1:2379?prefix=/f&follow=prefix"
    assert EtcdStore.from_url(kept.url).follow == "prefix"
    assert EtcdStore.from_url("etcd://127.0.0.1:2379?follow=all").url == "etcd://127.0.0.1:2379"
    for bad in ("everything", "ALL"):
        with pytest.raises(InvalidInput, match="follow="):
            EtcdStore.from_url(f"etcd://127.0.0.1:2379?follow={bad}")
    with pytest.raises(InvalidInput, match="follow="):
        EtcdStore(["127.0.0.1:2379"], follow="keys")
