"""The SQLite backend's shared feed (store/feed.py, as etcd's): once a process
says it keeps many long-lived watches (`share_watches`, as `hvfleet serve`
does), they are served from one poll of the event log on one thread
("sqlite-feed") instead of a poll per watch, each still seeing what its own
poll would give it (every event of its kind or name once, in order), also
when it starts from before what the feed holds; a watch with a sink is
handed its events on the feed's thread; an object that does not decode is
skipped by each watch and logged once per watch, as before."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.store.poison import hypervisor_doc, poison
from tests.store.watching import Seen, Watching, seen_of

from hvfleet.model import Hypervisor
from hvfleet.model.dashboard import HistoryPoint, HistorySeries, HistorySeriesSpec
from hvfleet.model.lease import renewed
from hvfleet.model.meta import ObjectMeta
from hvfleet.store import sqlite
from hvfleet.store.base import WatchEvent, Write
from hvfleet.store.sqlite import SqliteStore

MakeHv = Callable[..., Hypervisor]


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(str(tmp_path / "fleet.db"))
    store.share_watches()
    yield store
    store.close()


def _own(store: SqliteStore, kind: str | None, since: int, name: str | None = None) -> list[Seen]:
    """What the watch's own poll gives (a watch with a timeout polls for itself)."""
    return [seen_of(e) for e in store.watch(kind, since=since, name=name, timeout=0.3)]


def _writes(store: SqliteStore, make_hypervisor: MakeHv, tag: str) -> None:
    now = datetime.now(UTC)
    for i in range(3):
        store.create(make_hypervisor(f"{tag}{i}"), "op")
        store.create(renewed(None, f"{tag}{i}", f"agent/{tag}{i}", 30, now), f"agent/{tag}{i}")
    agent = f"agent/{tag}-batch"
    store.write_all([Write("create", make_hypervisor(f"{tag}-batch")),
                     Write("create", renewed(None, f"{tag}-batch", agent, 30, now))], agent)
    store.delete("Hypervisor", f"{tag}1")


def _polls(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> set[tuple[str, frozenset[str]]]:
    """The polls of the event log from now on: the polling thread's name, and
    the kinds polled."""
    polls: set[tuple[str, frozenset[str]]] = set()
    real = store._watch_kinds

    def counted(kinds: list[str], *args: object, **kwargs: object) -> Iterator[WatchEvent]:
        polls.add((threading.current_thread().name, frozenset(kinds)))
        return real(kinds, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_watch_kinds", counted)
    return polls


def _pollers(polls: set[tuple[str, frozenset[str]]]) -> set[str]:
    return {name for name, _ in polls}


def test_the_long_lived_watches_share_one_poll_and_see_what_their_own_would(
    shared: SqliteStore, make_hypervisor: MakeHv, monkeypatch: pytest.MonkeyPatch
) -> None:
    since = shared.revision()
    polls = _polls(shared, monkeypatch)
    watches = [Watching(shared, "Hypervisor", since), Watching(shared, None, since),
               Watching(shared, "Lease", since), Watching(shared, "Hypervisor", since, name="a2")]
    try:
        _writes(shared, make_hypervisor, "a")
        expected = [_own(shared, "Hypervisor", since), _own(shared, None, since),
                    _own(shared, "Lease", since), _own(shared, "Hypervisor", since, "a2")]
        assert [len(x) for x in expected] == [5, 9, 4, 1]
        for w, want in zip(watches, expected, strict=True):
            assert w.until(len(want)) == want and not w.errors
        # The watches' polls were the feed's; the others, this test's own (`_own`).
        assert _pollers(polls) == {"sqlite-feed", threading.current_thread().name}
    finally:
        for w in watches:
            w.close()


def test_a_store_that_did_not_share_its_watches_polls_per_watch(
    tmp_path: Path, make_hypervisor: MakeHv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's or a command's store: each watch polls for itself, as before."""
    store = SqliteStore(str(tmp_path / "own.db"))
    try:
        polls = _polls(store, monkeypatch)
        mine = Watching(store, "Hypervisor", store.revision(), name="d1")
        store.create(make_hypervisor("d0"), "op")
        store.create(make_hypervisor("d1"), "op")
        assert [s[2] for s in mine.until(1)] == ["d1"]
        mine.close()
        assert _pollers(polls) == {"test-watch-Hypervisor-d1"}
    finally:
        store.close()


def test_a_watch_from_before_what_the_feed_holds_polls_for_itself_then_joins(
    tmp_path: Path, make_hypervisor: MakeHv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite, "FEED_KEPT", 3)
    store = SqliteStore(str(tmp_path / "kept.db"))
    store.share_watches()
    try:
        since = store.revision()
        first = Watching(store, "Hypervisor", since)
        for i in range(8):
            store.create(make_hypervisor(f"k{i}"), "op")
        assert len(first.until(8)) == 8
        polls = _polls(store, monkeypatch)
        late = Watching(store, "Hypervisor", since)  # 8 events back: more than the feed keeps
        assert late.until(8) == first.seen
        assert late.thread.name in _pollers(polls)  # its own poll (the first watch started the feed)
        store.create(make_hypervisor("k8"), "op")  # after it joined: from the feed
        assert late.until(9) == first.until(9) == _own(store, "Hypervisor", since)
        assert not late.errors
        late.close()
        first.close()
    finally:
        store.close()


def test_a_sink_is_handed_each_revision_on_the_feeds_thread(
    shared: SqliteStore, make_hypervisor: MakeHv
) -> None:
    got: list[tuple[str, list[str]]] = []
    stop = threading.Event()
    since = shared.revision()
    thread = threading.Thread(target=shared.watch_into, daemon=True,
                              args=("Hypervisor", since, lambda events: got.append(
                                  (threading.current_thread().name, [e.name for e in events])), stop))
    thread.start()
    try:
        shared.create(make_hypervisor("s0"), "op")
        shared.create(make_hypervisor("s1"), "op")
        deadline = time.monotonic() + 15
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got == [("sqlite-feed", ["s0"]), ("sqlite-feed", ["s1"])]
    finally:
        stop.set()
        thread.join(5)


def test_an_object_that_does_not_decode_is_skipped_by_each_watch_and_logged_once_each(
    shared: SqliteStore, make_hypervisor: MakeHv, caplog: pytest.LogCaptureFixture
) -> None:
    since = shared.revision()
    watches = [Watching(shared, "Hypervisor", since), Watching(shared, None, since)]
    try:
        with caplog.at_level(logging.ERROR, logger="hvfleet.store"):
            poison(shared.url, "Hypervisor", "bad", hypervisor_doc("bad"))
            shared.create(make_hypervisor("good"), "op")
            for w in watches:
                assert [s[2] for s in w.until(1)] == ["good"] and not w.errors
        skips = [r for r in caplog.records if "skipped an undecodable object" in r.getMessage()]
        assert len(skips) == 2
        assert all("bad" in r.getMessage() for r in skips)
    finally:
        for w in watches:
            w.close()


def test_the_feed_leaves_the_history_series_out_and_a_watch_of_them_polls_for_itself(
    shared: SqliteStore, make_hypervisor: MakeHv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard's history series (large, read by a get) are no kind a
    server's watches follow: the feed does not read their rows, and a watch
    of them, should there be one, polls for itself."""
    polls = _polls(shared, monkeypatch)
    since = shared.revision()
    history, hosts = Watching(shared, "HistorySeries", since), Watching(shared, "Hypervisor", since)
    try:
        shared.create(HistorySeries(metadata=ObjectMeta(name="hist-fleet-10s"), spec=HistorySeriesSpec(
            series="fleet", tier="10s", points=[HistoryPoint(t=0, v={"cpu": ["1", "0", "8"]})])),
            "hvfleet-history")
        shared.create(make_hypervisor("h0"), "op")
        assert [s[2] for s in history.until(1)] == ["hist-fleet-10s"]
        assert [s[2] for s in hosts.until(1)] == ["h0"]
        feed_kinds = {kinds for name, kinds in polls if name == "sqlite-feed"}
        assert len(feed_kinds) == 1 and "Hypervisor" in next(iter(feed_kinds))
        assert "HistorySeries" not in next(iter(feed_kinds))
        assert ("test-watch-HistorySeries-None", frozenset({"HistorySeries"})) in polls
    finally:
        history.close()
        hosts.close()
