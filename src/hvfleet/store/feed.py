"""One stream of all of a store's objects, shared by the process's long-lived watches.

A server process follows the same writes several times over: the API's
watch fan-out of each kind, the garbage collector (every kind), the token
records, the fleet index. Each used to hold its own watch stream: on etcd
every followed write was sent by etcd, parsed from the gateway's JSON and
base64-decoded once per stream; on SQLite each stream polled the event log
on a thread of its own. `SharedFeed` holds one stream of every object (the
backend's: on etcd `watch_range` of every key, with its resume and failover;
on SQLite one poll of the event log for every kind) and hands each
revision's events to the watches whose kind (and name) they are, in order,
with `last_of_revision` as that watch's own stream would have it.

The feed's thread reads the stream itself (no reader thread before
it), and a watch may be handed its events on that thread (`watch_into`: the
API's fan-outs, which only queue them for their clients) instead of waking a
thread of its own per event: each hand-off between threads is a wake-up and
a GIL transfer, which on a loaded machine cost more than the event's work.

A watch joins at any revision the feed still holds (the last `kept` events);
one from further back reads its own stream until it reaches what the
feed holds and then joins, so it sees every event once and in order. Errors
of the shared stream (Gone when it fell behind a compaction, Unavailable
after an outage) end every joined watch with that error, as their own
streams would have, and the next watch starts the feed again.

On etcd the stream is of every key of the store, not only its objects
(SQLite has nothing beside them: each of its revisions is an object's
event): hvfleet also writes beside them (server secrets, among them the history sampler's turn,
renewed every 10 s), and each such write moves the store's revision. Those
events are dropped by their key before any decode, and a revision with no
object event is passed on as `Progress` to the watches that ask for it (the
Placement snapshot's follower), in order with the events: a reader waiting
until it has seen the store's current revision is not left waiting for a
revision no event carries.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hvfleet.model.errors import HvfleetError
from hvfleet.model.hypervisor import KINDS
from hvfleet.store import handoff
from hvfleet.store.base import WatchEvent
from hvfleet.store.undecodable import Undecodable, skipped

log = logging.getLogger(__name__)

# Events the feed keeps for watches that join a little behind it.
FEED_KEPT = 4096


@dataclass(frozen=True)
class Progress:
    """A revision with no object event: a write beside the objects (a server
    secret, the history sampler's turn). Handed on to the watches that wait
    for revisions (the Placement snapshot's follower), in order."""

    revision: int


Item = WatchEvent | Undecodable | Progress


@dataclass(frozen=True)
class Interest:
    """What one watch follows: a kind (None: every public kind, or with
    `stored`, every stored kind: `Store.watch_objects`) and maybe one name;
    with `progress`, also the revisions of the writes beside the objects."""

    kind: str | None
    name: str | None = None
    stored: bool = False
    progress: bool = False

    def wants(self, kind: str, name: str) -> bool:
        if self.kind is None:
            return self.stored or kind in KINDS  # access tokens are not in the all-kinds watch
        return kind == self.kind and (self.name is None or name == self.name)


def _kind_name(item: WatchEvent | Undecodable) -> tuple[str, str]:
    return item.kind, item.name  # an event's are told by its key: no decode


def _revision(item: Item) -> int:
    return item.revision


def _for(interest: Interest, group: list[Item]) -> list[Item]:
    """Items (of one or more whole revisions) as a watch of `interest` sees them:
    its own, each revision's last one marking the end of that revision. For an
    interest in `progress`, a revision with none of its own (a write of other
    kinds only: a claim on a stored Placement provider, a token) comes as
    Progress: a reader waiting for that revision need not wait out its bound."""
    mine: list[Item] = []
    for at, i in enumerate(group):
        if interest.progress if isinstance(i, Progress) else interest.wants(*_kind_name(i)):
            mine.append(i)
        elif (interest.progress and (at + 1 == len(group) or _revision(group[at + 1]) != i.revision)
              and not (mine and _revision(mine[-1]) == i.revision)):
            mine.append(Progress(i.revision))
    for at, item in enumerate(mine):
        if isinstance(item, WatchEvent):
            last = at + 1 == len(mine) or _revision(mine[at + 1]) != item.revision
            if item.last_of_revision != last:
                mine[at] = item.with_last(last)
    return mine


Sink = Callable[[list[Item]], None]


def _decodable(items: list[Item], on_undecodable: Callable[[Undecodable], None] | None,
               on_progress: Callable[[int], None] | None = None) -> list[WatchEvent]:
    """The events among `items`; each undecodable one logged, counted and handed
    to `on_undecodable`, as the watch's own stream would have; each Progress
    handed to `on_progress`."""
    events: list[WatchEvent] = []
    for item in items:
        if isinstance(item, Progress):
            if on_progress is not None:
                on_progress(item.revision)
        elif isinstance(item, Undecodable):
            skipped(item, "watch")
            if on_undecodable is not None:
                on_undecodable(item)
        else:
            events.append(item)
    return events


class _Wake:
    """Put in a watch's inbox to wake its thread: its stop was set, or the feed closed."""


WAKE = _Wake()


class _Joined:
    """One watch joined to the feed: the revision groups meant for it, in order,
    queued for its thread, or handed to its `sink` on the feed's thread (then
    only the feed's error is queued)."""

    def __init__(self, interest: Interest, since: int, sink: Sink | None = None) -> None:
        self.interest = interest
        self.since = since
        self.sink = sink
        self.inbox: queue.SimpleQueue[list[Item] | HvfleetError | _Wake] = queue.SimpleQueue()

    def offer(self, revision: int, group: list[Item]) -> None:
        if revision <= self.since:
            return
        mine = _for(self.interest, group)
        if not mine:
            return
        if self.sink is not None:
            self.sink(mine)
        else:
            handoff.defer(self.inbox.put, mine)  # once the feed's burst is handled


class _StopWakers:
    """Wakes the watches waiting on their inboxes when their `stop` is set, so
    an idle watch's thread sleeps until an event, an error, its stop or the
    feed's close, instead of waking to look (10 times a second per watch
    before). A `threading.Event` tells no one when it is set: one thread per
    stop Event in use waits on it (the watches of one consumer share theirs:
    a server has a handful), and ends once it is set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[threading.Event, set[_Joined]] = {}

    def add(self, stop: threading.Event, j: _Joined) -> None:
        with self._lock:
            joined = self._waiting.get(stop)
            if joined is None:
                joined = self._waiting[stop] = set()
                threading.Thread(target=self._wait, args=(stop,), name="feed-stop-waker",
                                 daemon=True).start()
            joined.add(j)

    def discard(self, stop: threading.Event, j: _Joined) -> None:
        with self._lock:
            joined = self._waiting.get(stop)
            if joined is not None:
                joined.discard(j)

    def _wait(self, stop: threading.Event) -> None:
        stop.wait()
        with self._lock:
            joined = self._waiting.pop(stop, set())
        for j in joined:
            j.inbox.put(WAKE)


class SharedFeed:
    """The shared watch of every key of a store: its objects' events, and the
    revisions of the writes beside them as Progress (etcd's)."""

    def __init__(self, stream: Callable[[int, threading.Event, Callable[[Undecodable], None],
                                         Callable[[Callable[[], None]], None], Callable[[int], None]],
                                        Iterator[WatchEvent]],
                 kept: int | None = None, name: str = "store-feed") -> None:
        # stream(since, stop, on_undecodable, inline, on_progress): the store's
        # watch_range of every key of the store, its objects' events decoded, read
        # in the feed's thread (`inline` is given each stream's abort; `on_progress`
        # each revision that has no object event).
        self._stream = stream
        self._name = name  # its thread's
        self._kept = FEED_KEPT if kept is None else kept
        self._lock = threading.Lock()
        self._joined: set[_Joined] = set()
        self._groups: deque[tuple[int, list[Item]]] = deque()
        self._held = 0  # events in _groups
        self.horizon = 0  # _groups holds every event with horizon < revision <= position
        self.position = 0
        self._running = False
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._abort: Callable[[], None] | None = None  # ends the current stream's read
        self._wakers = _StopWakers()

    # -- the shared stream ---------------------------------------------------------------

    def _start(self, since: int) -> None:
        """(lock held) Follow from `since`."""
        self._groups.clear()
        self._held = 0
        self.horizon = self.position = since
        self._running = True
        self._thread = threading.Thread(target=self._run, args=(since,), name=self._name, daemon=True)
        self._thread.start()

    def _run(self, since: int) -> None:
        group: list[Item] = []

        def undecodable(exc: Undecodable) -> None:
            if group:
                group.append(exc)  # its revision goes on: published with the rest of it
            else:
                self._publish(exc.revision, [exc])

        def progress(revision: int) -> None:
            nonlocal group
            if group:  # what an undecodable event left open ends before it
                self._publish(_revision(group[-1]), group)
                group = []
            self._publish(revision, [Progress(revision)])

        def reading(abort: Callable[[], None]) -> None:
            self._abort = abort
            if self._closed.is_set():  # closed while this stream opened
                abort()

        error: HvfleetError | None = None
        try:
            # The hand-offs to the joined watches go out once per burst read
            # (`handoff`: the stream flushes them before it waits for more).
            with handoff.batch():
                for event in self._stream(since, self._closed, undecodable, reading, progress):
                    group.append(event)
                    if event.last_of_revision:
                        self._publish(event.revision, group)
                        group = []
        except HvfleetError as exc:
            error = exc
        with self._lock:
            self._running = False
            joined, self._joined = self._joined, set()
        for j in joined:  # its error, or (closed) a wake-up to see that it is
            j.inbox.put(WAKE if error is None else error)

    def _publish(self, revision: int, group: list[Item]) -> None:
        with self._lock:
            self._groups.append((revision, group))
            self._held += len(group)
            while self._held > self._kept and len(self._groups) > 1:
                dropped, items = self._groups.popleft()
                self._held -= len(items)
                self.horizon = dropped
            self.position = revision
            joined = list(self._joined)
        for j in joined:
            try:
                j.offer(revision, group)
            except Exception:  # a watch's sink failing must not end everyone's feed
                log.exception("store feed: a watch failed to take revision %d", revision)

    # -- watches -------------------------------------------------------------------------

    def _join(self, interest: Interest, since: int, sink: Sink | None = None) -> _Joined | None:
        """A watch of `interest` from `since`, with what the feed holds after it
        queued (or handed to `sink`); None when `since` is older than what the
        feed holds."""
        with self._lock:
            if self._closed.is_set():
                return None
            if not self._running:
                self._start(since)
            elif since < self.horizon:
                return None
            j = _Joined(interest, since, sink)
            for revision, group in self._groups:
                j.offer(revision, group)
            self._joined.add(j)
            return j

    def _received(self, j: _Joined, stop: threading.Event | None) -> Iterator[list[Item]]:
        """The groups queued for `j` until `stop` is set or the feed closes;
        raises the feed's error. Sleeps while nothing comes: `stop` being set
        and the feed closing each put a wake-up in the inbox."""
        if stop is not None:
            self._wakers.add(stop, j)
        try:
            while stop is None or not stop.is_set():
                got = j.inbox.get()
                if isinstance(got, _Wake):
                    if self._closed.is_set():
                        return
                    continue
                if isinstance(got, HvfleetError):
                    raise got
                yield got
        finally:
            if stop is not None:
                self._wakers.discard(stop, j)

    def _leave(self, j: _Joined) -> None:
        with self._lock:
            self._joined.discard(j)

    def watch(self, interest: Interest, since: int, stop: threading.Event | None,
              on_undecodable: Callable[[Undecodable], None] | None,
              own_stream: Callable[[int], Iterator[WatchEvent]],
              on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        """Events of `interest` with revision > since until `stop` is set (and,
        for an interest in `progress`, each revision without an object event
        handed to `on_progress` in its place). `own_stream(since)` is this
        watch's own stream, read while `since` is older than what the feed
        holds."""
        last = since

        def progressed(revision: int) -> None:
            nonlocal last
            last = revision
            if on_progress is not None:
                on_progress(revision)

        while stop is None or not stop.is_set():
            j = self._join(interest, last)
            if j is None:
                if self._closed.is_set():
                    return
                # Behind the feed: its own stream up to the end of a revision
                # the feed holds, then join from there.
                caught_up = False
                events = own_stream(last)
                try:
                    for event in events:
                        last = event.revision
                        yield event
                        if event.last_of_revision and last >= self.horizon:
                            caught_up = True
                            break
                finally:
                    close = getattr(events, "close", None)
                    if close is not None:
                        close()
                if not caught_up:
                    return  # stopped
                continue
            try:
                for got in self._received(j, stop):
                    for item in _decodable(got, on_undecodable, progressed):
                        last = item.revision
                        yield item
                return
            finally:
                self._leave(j)

    def watch_into(self, interest: Interest, since: int, sink: Callable[[list[WatchEvent]], None],
                   stop: threading.Event, on_undecodable: Callable[[Undecodable], None] | None,
                   own_stream: Callable[[int], Iterator[WatchEvent]]) -> None:
        """`watch`, each revision's events of `interest` handed to `sink`
        (on the feed's thread once joined, so `sink` must be quick and never
        wait) until `stop` is set; raises what `watch` raises."""

        def deliver(items: list[Item]) -> None:
            events = _decodable(items, on_undecodable)
            if events:
                sink(events)

        last = since
        while not stop.is_set():
            j = self._join(interest, last, deliver)
            if j is None:
                if self._closed.is_set():
                    return
                # Behind the feed: its own stream, a revision at a time, as `watch` does.
                group: list[WatchEvent] = []
                for event in self.watch(interest, last, stop, on_undecodable, own_stream):
                    group.append(event)
                    if event.last_of_revision:
                        last = event.revision
                        sink(group)
                        group = []
                        if last >= self.horizon:
                            break
                continue
            try:
                for _ in self._received(j, stop):  # only an error comes
                    raise AssertionError("a watch with a sink is handed its events, not queued them")
                return
            finally:
                self._leave(j)

    def close(self) -> None:
        self._closed.set()
        abort = self._abort
        if abort is not None:
            abort()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
