"""Watch fan-out: one store watch per kind, shared by every client watching it.

A background thread per kind follows `Store.watch` and keeps the last
`history` events; each client watch is a `Subscription` with its own bounded
queue. The fan-out thread only appends to queues and never waits for a client,
so a slow watcher cannot delay the others: when its queue is full it is marked
overflowed and its stream ends with an `Expired` (410) ERROR event, the signal
Kubernetes clients answer by listing again. A watch from a revision older than
the kept history first catches up from the store itself (Gone there means
compacted: 410 as well). `seen_through` is how a label-selected watch sees an
event (an object entering or leaving the selection), from the previous state
the store's event carries, so the kept history and a catch-up agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hvfleet.model.errors import Gone, HvfleetError, TooManyRequests
from hvfleet.model.hypervisor import Resource
from hvfleet.model.selectors import Selector
from hvfleet.store import handoff
from hvfleet.store.base import EventType, Store, WatchEvent
from hvfleet.store.encoding import with_version
from hvfleet.store.undecodable import Undecodable

# Encoded event lines kept for clients that are a little behind the others.
_ENCODED_KEPT = 1024


@dataclass(frozen=True)
class WatchLimits:
    per_token: int = 16  # open watches per token (Identity.token_id)
    queue: int = 1000  # events queued for one client before it is dropped
    history: int = 1000  # events the fan-out keeps for watches that start a little back
    send_timeout: float = 30.0  # seconds one write to a client may take before it is dropped
    max_timeout: float = 1800.0  # longest watch call (timeoutSeconds is capped to this)
    bookmark_interval: float = 60.0  # seconds between BOOKMARK events (allowWatchBookmarks)


class Subscription:
    """One client's queue. `take` runs on the fan-out thread, the rest on the
    client's event loop.

    With `direct`, a consumer may take events on the fan-out's thread itself:
    `direct(events)` is called there while nothing is queued for the client
    or held by it (`next_batch` to `done`), so the events stay in order; when
    it returns True they are consumed (not queued, the loop not woken), when
    False they are queued as for any client."""

    def __init__(self, fanout: KindFanout, since: int, name: str | None, limit: int,
                 loop: asyncio.AbstractEventLoop,
                 direct: Callable[[list[WatchEvent]], bool] | None = None) -> None:
        self.fanout = fanout
        self.since = since
        self.name = name
        self._limit = limit
        self.loop = loop
        self._items: deque[WatchEvent] = deque()
        # Set (on the loop) when something arrived; next_batch waits on a bare
        # future and a timer, not wait_for() on an Event (a Task per wait, and a
        # wait per followed event).
        self._ready = False
        self._waiter: asyncio.Future[None] | None = None
        self._signalled = False
        self.overflowed = False
        self.expired = False  # the fan-out itself lost history (store compacted past it)
        self._direct = direct
        # Set (on the loop) before a batch is taken off the queue, cleared by
        # `done` once it is consumed: while set, `direct` is not called. Set
        # from the start with `direct`: the replay is the consumer's first.
        self._held = direct is not None

    def take(self, events: list[WatchEvent]) -> bool:
        """Queue this client's part of a revision's events (on the fan-out's
        thread); True when its loop must be woken for them (`wake_all`): the
        fan-out wakes each loop once for all its clients."""
        if (self._direct is not None and not self._items and not self._held
                and not self.overflowed and self.name is None and self._direct(events)):
            return False
        got = False
        for event in events:
            if self.name is not None and event.name != self.name:
                continue
            got = True
            if len(self._items) >= self._limit:
                self.overflowed = True
            else:
                self._items.append(event)
        if not got or self._signalled:
            return False
        self._signalled = True
        return True

    def expire(self) -> None:
        self.expired = True
        if not self._signalled:
            self._signalled = True
            with contextlib.suppress(RuntimeError):  # the loop closed: the client is gone
                self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._ready = True
        if self._waiter is not None:
            _release(self._waiter)

    async def next_batch(self, timeout: float) -> tuple[list[WatchEvent], int]:
        """Queued events (maybe none after `timeout`), and a revision up to which
        every event of this kind has been handed over (for bookmarks)."""
        if not self._ready:
            waiter = self._waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout, _release, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        self._ready = False
        self._signalled = False
        position = self.fanout.position
        # Held before the first popleft: the fan-out thread sees either the
        # queue not empty or the batch held, so `direct` never overtakes it.
        self._held = True
        # One popleft at a time: the fan-out thread may append meanwhile, and an
        # append between a copy and a clear() would be lost.
        items, out = self._items, []
        while items:
            out.append(items.popleft())
        if not out:
            self._held = False
        return out, position

    def done(self) -> None:
        """The batch `next_batch` returned is consumed (for `direct`)."""
        self._held = False


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _wake_all(subs: list[Subscription]) -> None:
    for sub in subs:
        sub._wake()


class KindFanout:
    """The shared store watch of one kind."""

    def __init__(self, store: Store, kind: str, history: int) -> None:
        self.store = store
        self.kind = kind
        self._lock = threading.Lock()
        self._history: deque[WatchEvent] = deque(maxlen=history)
        self._subs: set[Subscription] = set()
        self._encoded: OrderedDict[tuple[int, str], bytes] = OrderedDict()
        self._stop = threading.Event()
        self.position = store.revision()
        # The history holds every event of this kind with horizon < revision <= position.
        self.horizon = self.position
        self._thread = threading.Thread(target=self._run, name=f"watch-fanout-{kind}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # `_take` runs on the store's shared stream's thread where it has one.
                self.store.watch_into(self.kind, self.position, self._take, self._stop)
            except Gone:
                with self._lock:
                    self._history.clear()
                    self.position = self.horizon = self.store.revision()
                    subs = list(self._subs)
                for sub in subs:
                    sub.expire()
            except HvfleetError:
                self._stop.wait(1.0)  # store unavailable: retry from the same revision

    def _take(self, events: list[WatchEvent]) -> None:
        """One revision's events of this kind: kept, queued for every client,
        and each client loop woken once (one `call_soon_threadsafe` per loop,
        not per event per client). Never waits for a client."""
        with self._lock:
            for event in events:
                if len(self._history) == self._history.maxlen:
                    # Dropping an event leaves its revision to the store's catch-up.
                    self.horizon = self._history[0].revision
                self._history.append(event)
            subs = list(self._subs)
        woken: dict[asyncio.AbstractEventLoop, list[Subscription]] = {}
        for sub in subs:
            if sub.take(events):
                woken.setdefault(sub.loop, []).append(sub)
        for loop, them in woken.items():
            with contextlib.suppress(RuntimeError):  # the loop closed: its clients are gone
                # On the etcd feed's thread, sent once its burst is handled (`handoff`).
                handoff.call_soon_threadsafe(loop, _wake_all, them)
        # Moved only after every queue has the events (see next_batch), and only
        # at the end of a revision: a bookmark at a revision must not leave part
        # of that revision's batch behind.
        if events[-1].last_of_revision:
            self.position = events[-1].revision

    def subscribe(self, since: int, name: str | None, limit: int,
                  loop: asyncio.AbstractEventLoop,
                  direct: Callable[[list[WatchEvent]], bool] | None = None,
                  ) -> tuple[Subscription, list[WatchEvent], int | None]:
        """A new subscription, the kept events after `since`, and — when `since`
        is older than the kept history — the revision up to which the caller must
        first catch up from the store (None: no catch-up needed). `direct`: see
        `Subscription` (the replay and catch-up are the caller's to consume
        before it calls `done`)."""
        sub = Subscription(self, since, name, limit, loop, direct)
        with self._lock:
            replay = [e for e in self._history if e.revision > since
                      and (name is None or e.name == name)]
            catch_up = self.horizon if since < self.horizon else None
            self._subs.add(sub)
        return sub, replay, catch_up

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    def encoded(self, event: WatchEvent) -> bytes:
        """The event's JSON line, built once however many clients receive it:
        from the stored bytes when the store vouched for them (no decode, no
        encode), else from the object."""
        # One etcd batch is one revision for all its objects: the name is part of the key.
        key = (event.revision, event.name)
        with self._lock:
            line = self._encoded.get(key)
        if line is None:
            line = (b'{"type":"%s","object":' % event.type.encode()
                    + event.object_json() + b"}\n")
            with self._lock:
                self._encoded[key] = line
                while len(self._encoded) > _ENCODED_KEPT:
                    self._encoded.popitem(last=False)
        return line

    def watchers(self) -> int:
        with self._lock:
            return len(self._subs)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class WatchHub:
    """The fan-outs of one server process, and the per-token watch counts."""

    def __init__(self, store: Store, limits: WatchLimits) -> None:
        self.store = store
        self.limits = limits
        self._lock = threading.Lock()
        self._fanouts: dict[str, KindFanout] = {}
        self._open: dict[str, int] = {}

    def fanout(self, kind: str) -> KindFanout:
        with self._lock:
            f = self._fanouts.get(kind)
            if f is None:
                f = self._fanouts[kind] = KindFanout(self.store, kind, self.limits.history)
            return f

    def acquire(self, token_id: str) -> Callable[[], None]:
        """Take one of the token's watch slots (TooManyRequests when none is left);
        returns the function that gives it back (call it exactly once)."""
        with self._lock:
            n = self._open.get(token_id, 0)
            if n >= self.limits.per_token:
                raise TooManyRequests(
                    f"too many watches open for this token ({n}, at most {self.limits.per_token})"
                )
            self._open[token_id] = n + 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._open[token_id] -= 1
                if not self._open[token_id]:
                    del self._open[token_id]

        return release

    def open_watches(self, token_id: str) -> int:
        with self._lock:
            return self._open.get(token_id, 0)

    def close(self) -> None:
        with self._lock:
            fanouts = list(self._fanouts.values())
            self._fanouts.clear()
        for f in fanouts:
            f.close()


def seen_through(
    event: WatchEvent, selector: Selector, visible: Callable[[Resource], bool] | None = None
) -> tuple[EventType, Resource] | None:
    """The event as a watch with this label selector sees it (None: not at all),
    as kube-apiserver's watch cache tells it: an object modified so that it
    starts matching is ADDED, one that stops matching is DELETED — with its
    previous content, the one the client holds, at the event's revision — one
    that matches before and after is MODIFIED, and one that matches neither is
    not sent. A name filter needs none of this: a name never changes. `visible`
    narrows further (what an agent may read, hvfleet.server.narrowing), the
    same way, except that an object is never shown on a guess of its past."""
    if not selector.requirements and visible is None:
        return event.type, event.object

    def matches(obj: Resource) -> bool:
        return selector.matches(obj.metadata.labels) and (visible is None or visible(obj))

    matches_now = matches(event.object)
    if event.type != "MODIFIED":  # a DELETED event's object is the last one stored
        return (event.type, event.object) if matches_now else None
    previous: Resource | None = None
    try:
        previous = event.previous() if event.knows_previous else None
    except Undecodable:
        previous = None  # its previous state cannot be read: as a store that cannot tell
    # A store that cannot tell: as if it matched, so that a client is never left
    # holding an object that left; at worst it is told to delete one it never
    # had (which Kubernetes clients ignore). Not for a narrowed watch: that
    # would show an object its caller may not read.
    matched_before = matches(previous) if previous is not None else visible is None
    if matches_now:
        return ("MODIFIED" if matched_before else "ADDED"), event.object
    if not matched_before:
        return None
    left = event.object if previous is None else with_version(previous, event.revision)
    return "DELETED", left


def catch_up_batch(
    events: Iterator[WatchEvent], until: int, size: int = 500
) -> tuple[list[WatchEvent], bool]:
    """Up to `size` events with revision <= `until` from a store watch; True when
    the catch-up is complete (the store's watch went quiet or passed `until`)."""
    out: list[WatchEvent] = []
    for event in events:
        if event.revision > until:
            return out, True
        out.append(event)
        if len(out) >= size:
            return out, False
    return out, True
