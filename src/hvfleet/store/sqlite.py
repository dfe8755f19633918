"""The embedded store: one SQLite file, safe for several processes at once.

WAL mode lets readers run beside one writer; every write is a `BEGIN
IMMEDIATE` transaction that re-reads what it depends on, checks it (CAS on
resourceVersion, field ownership, a claim's capacity) and writes, so a check
and its write can never be split by another process. Revisions come from one
counter, as in etcd, and every write appends an event, which is what `watch`
reads. Objects and events hold the stored encoding of `hvfleet.store.encoding`
(the resourceVersion is the row's revision). Old events are compacted away
beyond `EVENT_HISTORY` revisions; asking for them raises Gone, as etcd does.
"""

from __future__ import annotations

import builtins
import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from hvfleet.model.errors import (
    AlreadyExists,
    Gone,
    NotFound,
    Unavailable,
)
from hvfleet.model.hypervisor import KINDS, STORED_KINDS, Hypervisor, Reservation, Resource
from hvfleet.model.kinds import strategy, strategy_of
from hvfleet.model.selectors import Selector
from hvfleet.store import handoff
from hvfleet.store.base import (
    ClaimCheck,
    EventType,
    FieldPath,
    ListResult,
    StaleVersion,
    Store,
    Stored,
    WatchEvent,
    Write,
    as_selector,
    check_batch,
    gc_paused,
    kind_of,
)
from hvfleet.store.decoded import DecodedAt
from hvfleet.store.encoding import decode, encode_and_read, vouched, with_version
from hvfleet.store.feed import Interest, SharedFeed
from hvfleet.store.ownership import prepare_create, prepare_update_over, unchanged
from hvfleet.store.undecodable import Undecodable, skipped

T = TypeVar("T")

# Events the shared feed keeps for watches that join a little behind it: few,
# as a watch further behind polls the local event log for itself (cheap here),
# and each kept event holds its stored bodies and, once decoded, its object
# (4,096 of them were ~30 MiB of a 1,000-host server: bench/sqlite_follow.py).
FEED_KEPT = 256
# Objects kept decoded for the watches (hvfleet.store.decoded): about a second
# of a 10,000-host fleet's 1,000 writes/s, within which the feed hands an event
# to every watch and a request's catch-up reads it (further back, it decodes).
DECODED_KEPT = 1024

# The kinds a server's long-lived watches follow: those its shared feed polls.
_FOLLOWED = frozenset(k for k in STORED_KINDS if strategy(k).followed)

EVENT_HISTORY = 100_000
_COMPACT_EVERY = 1_000
_BUSY_TIMEOUT_MS = 30_000

# Each entry moves the schema one version up; never edit a released entry.
MIGRATIONS: list[str] = [
    # 1: objects, their events, and the revision counter.
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
    INSERT INTO meta VALUES ('revision', 0), ('compacted', 0);
    CREATE TABLE objects (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        rv INTEGER NOT NULL,
        labels TEXT NOT NULL,
        host TEXT,
        body TEXT NOT NULL,
        PRIMARY KEY (kind, name)
    );
    CREATE INDEX objects_by_host ON objects (kind, host);
    CREATE TABLE events (
        rev INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        type TEXT NOT NULL,
        body TEXT NOT NULL
    );
    """,
    # 2: an object's earlier events by key, for each event's previous state.
    """
    CREATE INDEX events_by_key ON events (kind, name, rev);
    """,
    # 3: values the servers over this store share (Store.server_secret): no
    # kind, no events, so no list or watch ever shows them.
    """
    CREATE TABLE server_secrets (
        name TEXT PRIMARY KEY,
        value BLOB NOT NULL,
        version INTEGER NOT NULL
    );
    """,
]


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _create_owner_only(path: str) -> None:
    """Create the database file 0600 if it is missing: it holds every token's
    hash and the whole fleet, and SQLite gives its -wal and -shm files the
    mode of the database file."""
    if path == ":memory:" or path.startswith("file:"):
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise Unavailable(f"store sqlite:///{path}: cannot create it: {exc.strerror}") from None
    os.close(fd)


class SqliteStore(Store):
    events_at_hand = True

    def __init__(self, path: str) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self._lock = threading.RLock()
        # The objects this store's watches hand over (decoded once for all of
        # them), and its own writes' read-back objects: kept once their
        # transaction has committed (a revision rolled back is used again).
        self._decoded = DecodedAt(DECODED_KEPT)
        self._written: builtins.list[tuple[tuple[str, str, int], Resource]] = []
        # The one poll of every object that this store's long-lived watches share
        # once the process says it keeps many (`share_watches`: a server).
        self._feed = SharedFeed(self._feed_stream, kept=FEED_KEPT, name="sqlite-feed")
        self._shared = False
        self._marks_lock = threading.Lock()
        self._marks: sqlite3.Connection | None = None
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise Unavailable(f"store {self.url}: directory {directory} does not exist")
        _create_owner_only(path)
        try:
            self._db = sqlite3.connect(
                path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                check_same_thread=False,
            )
            self._db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
            self._marks = self._mark_connection(path)
        except sqlite3.DatabaseError as exc:
            raise Unavailable(f"store {self.url}: {exc}") from None

    # -- schema ---------------------------------------------------------------------

    def _migrate(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise Unavailable(
                    f"store {self.url}: schema version {version} is newer than this hvfleet "
                    f"understands ({len(MIGRATIONS)}); upgrade hvfleet"
                )
            for i in range(version, len(MIGRATIONS)):
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {i + 1}")

    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    # -- server secrets ---------------------------------------------------------------

    def server_secret(self, name: str) -> tuple[bytes, int] | None:
        row = self._read(lambda db: db.execute(
            "SELECT value, version FROM server_secrets WHERE name = ?", (name,)).fetchone())
        return None if row is None else (bytes(row[0]), int(row[1]))

    def put_server_secret(self, name: str, value: bytes, replaces: int | None) -> bool:
        with self._write() as db:
            row = db.execute("SELECT version FROM server_secrets WHERE name = ?", (name,)).fetchone()
            if (None if row is None else int(row[0])) != replaces:
                return False
            db.execute("INSERT OR REPLACE INTO server_secrets VALUES (?, ?, ?)",
                       (name, value, (replaces or 0) + 1))
        return True

    # -- transactions -----------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: the database write lock is taken at BEGIN, so
        everything read inside is still true at COMMIT."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise Unavailable(f"store {self.url}: {exc}") from None
            self._written.clear()
            try:
                yield self._db
            except BaseException:
                self._written.clear()
                self._db.execute("ROLLBACK")
                raise
            else:
                try:
                    self._db.execute("COMMIT")
                finally:
                    written, self._written = self._written, []
                for at, obj in written:  # committed (else COMMIT raised)
                    self._decoded.put(at, obj)

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                return fn(self._db)
            except sqlite3.OperationalError as exc:
                raise Unavailable(f"store {self.url}: {exc}") from None

    def _bump(self, db: sqlite3.Connection) -> int:
        rev = int(db.execute(
            "UPDATE meta SET value = value + 1 WHERE key = 'revision' RETURNING value"
        ).fetchone()[0])
        if rev % _COMPACT_EVERY == 0 and rev > EVENT_HISTORY:
            floor = rev - EVENT_HISTORY
            # Each object's last write at or below the floor stays (as etcd keeps
            # each key's latest version when it compacts): it is the object's state
            # at every revision from the floor up to its next write, which a watch
            # from such a revision needs as that next event's previous state.
            db.execute(
                "DELETE FROM events WHERE rev <= ? AND (type = 'DELETED' OR rev NOT IN "
                "(SELECT max(rev) FROM events WHERE rev <= ? GROUP BY kind, name))",
                (floor, floor),
            )
            db.execute("UPDATE meta SET value = ? WHERE key = 'compacted'", (floor,))
        return rev

    def _put(self, db: sqlite3.Connection, obj: Resource, etype: EventType) -> Resource:
        rev = self._bump(db)
        obj = with_version(obj, rev)
        sealed, read = encode_and_read(obj)
        body = sealed.decode()
        # What a watch decodes from `body` at `rev`: its watches never decode
        # this store's own writes (kept once the transaction commits).
        if strategy_of(obj).followed:
            self._written.append(((obj.kind, obj.metadata.name, rev), with_version(read, rev)))
        db.execute(
            "INSERT OR REPLACE INTO objects (kind, name, rv, labels, host, body) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (obj.kind, obj.metadata.name, rev, json.dumps(obj.metadata.labels),
             strategy_of(obj).indexed_host(obj), body),
        )
        db.execute(
            "INSERT INTO events (rev, kind, name, type, body) VALUES (?, ?, ?, ?, ?)",
            (rev, obj.kind, obj.metadata.name, etype, body),
        )
        return obj

    def _load(self, db: sqlite3.Connection, kind: str, name: str) -> Resource | None:
        """The stored object, None when absent; Undecodable when it does not decode."""
        row = db.execute(
            "SELECT body, rv FROM objects WHERE kind = ? AND name = ?", (kind, name)
        ).fetchone()
        return None if row is None else decode(kind, row[0], row[1], name)

    def _prepare_update(self, db: sqlite3.Connection, obj: Resource, manager: str, force: bool,
                        now: datetime, applied: frozenset[FieldPath] | None = None,
                        ) -> tuple[Resource | None, Resource]:
        """The stored object and `obj` as stored by an update over it (or over one
        that does not decode, then None: an overwrite naming its version)."""
        def read() -> Resource:
            old = self._load(db, obj.kind, obj.metadata.name)
            if old is None:
                raise NotFound(f"{obj.kind} {obj.metadata.name!r} not found")
            return old

        return prepare_update_over(read, obj, manager, force=force, now=now, applied=applied)

    def _exists(self, db: sqlite3.Connection, kind: str, name: str) -> bool:
        return db.execute(
            "SELECT 1 FROM objects WHERE kind = ? AND name = ?", (kind, name)
        ).fetchone() is not None

    # -- the contract --------------------------------------------------------------------

    def get(self, kind: str, name: str) -> Resource:
        kind = kind_of(kind)
        obj = self._read(lambda db: self._load(db, kind, name))
        if obj is None:
            raise NotFound(f"{kind} {name!r} not found")
        return obj

    def list(self, kind: str, selector: Selector | str | None = None) -> ListResult:
        kind = kind_of(kind)
        sel = as_selector(selector)

        def read(db: sqlite3.Connection) -> tuple[builtins.list[Any], int]:
            db.execute("BEGIN")
            try:
                rows = db.execute(
                    "SELECT labels, body, rv, name FROM objects WHERE kind = ? ORDER BY name",
                    (kind,),
                ).fetchall()
                rev = db.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()[0]
            finally:
                db.execute("COMMIT")
            return rows, int(rev)

        rows, rev = self._read(read)
        items: builtins.list[Resource] = []
        bad: builtins.list[Undecodable] = []
        with gc_paused():
            for labels, body, rv, name in rows:
                if not sel.matches(json.loads(labels)):
                    continue
                try:
                    items.append(decode(kind, body, rv, name))
                except Undecodable as exc:
                    skipped(exc, f"list {kind}")
                    bad.append(exc)
        return ListResult(items=items, revision=rev, undecodable=bad)

    def create(self, obj: Resource, manager: str) -> Resource:
        with self._write() as db:
            if self._exists(db, obj.kind, obj.metadata.name):
                raise AlreadyExists(f"{obj.kind} {obj.metadata.name!r} already exists")
            return self._put(db, prepare_create(obj, manager, _now()), "ADDED")

    def update(self, obj: Resource, manager: str, *, force: bool = False) -> Resource:
        with self._write() as db:
            old, new = self._prepare_update(db, obj, manager, force, _now())
            return old if old is not None and unchanged(old, new) else self._put(db, new, "MODIFIED")

    def write_all(
        self, writes: Sequence[Write], manager: str, *, force: bool = False
    ) -> builtins.list[Resource]:
        check_batch(writes)
        out: builtins.list[Resource] = []
        # One IMMEDIATE transaction: every check sees the state every write lands
        # on, and a failure rolls back the writes already made inside it.
        with self._write() as db:
            now = _now()
            for w in writes:
                obj = w.object
                if w.action == "delete":
                    self._delete(db, obj.kind, obj.metadata.name, obj.metadata.resource_version)
                    out.append(obj)
                elif w.action == "create":
                    if self._exists(db, obj.kind, obj.metadata.name):
                        raise AlreadyExists(f"{obj.kind} {obj.metadata.name!r} already exists")
                    if w.check is not None and isinstance(obj, Reservation):
                        # Inside the transaction: the batch's own deletes and claims count.
                        self._check_claim(db, obj, w.check)
                    out.append(self._put(db, prepare_create(obj, manager, now, w.applied), "ADDED"))
                else:
                    old, new = self._prepare_update(db, obj, manager, force, now, w.applied)
                    out.append(old if old is not None and unchanged(old, new)
                               else self._put(db, new, "MODIFIED"))
        return out

    def delete(self, kind: str, name: str, resource_version: str | None = None) -> None:
        with self._write() as db:
            self._delete(db, kind_of(kind), name, resource_version)

    def _delete(self, db: sqlite3.Connection, kind: str, name: str, resource_version: str | None) -> None:
        # The stored body and version only: an object that does not decode
        # can be deleted too (its DELETED event carries the same body).
        row = db.execute(
            "SELECT body, rv FROM objects WHERE kind = ? AND name = ?", (kind, name)
        ).fetchone()
        if row is None:
            raise NotFound(f"{kind} {name!r} not found")
        body, current = row
        if resource_version is not None and resource_version != str(current):
            raise StaleVersion(
                f"{kind} {name}: resourceVersion {resource_version} is stale "
                f"(current is {current})"
            )
        rev = self._bump(db)
        db.execute("DELETE FROM objects WHERE kind = ? AND name = ?", (kind, name))
        db.execute(
            "INSERT INTO events (rev, kind, name, type, body) VALUES (?, ?, ?, 'DELETED', ?)",
            (rev, kind, name, body),
        )

    def revision(self) -> int:
        return int(self._read(
            lambda db: db.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()[0]
        ))

    # A connection of its own for `change_mark`, which never writes: SQLite's
    # data_version on it changes with every commit of any other connection,
    # this store's own included, in this process or another. The store's
    # connection cannot tell (its own commits leave its data_version as it
    # is), and its lock is held through every write.
    @staticmethod
    def _mark_connection(path: str) -> sqlite3.Connection | None:
        if path == ":memory:":
            return None  # another connection would open another database
        db = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout = 0")  # busy: no mark, never a wait
        return db

    def ready(self) -> None:
        """One read on the connection `change_mark` uses: a reader in WAL mode
        is never held up by a writer, so a write of this process waiting for
        another's lock (the busy timeout) is no failed check, as a read
        through the store's own connection would be, queued behind it."""
        if self._marks is None:
            return
        with self._marks_lock:
            try:
                self._marks.execute("SELECT value FROM meta WHERE key = 'revision'").fetchone()
            except sqlite3.Error as exc:
                raise Unavailable(f"store {self.url}: {exc}") from None

    def change_mark(self) -> int | None:
        if self._marks is None or not self._marks_lock.acquire(blocking=False):
            return None
        try:
            return int(self._marks.execute("PRAGMA data_version").fetchone()[0])
        except sqlite3.Error:
            return None  # busy (a WAL recovery), or closed
        finally:
            self._marks_lock.release()

    def _watch(self, kind: str | None, since: int, name: str | None, stop: threading.Event | None,
               timeout: float | None,
               on_undecodable: Callable[[Undecodable], None] | None,
               on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        kinds = [kind] if kind else list(KINDS)
        if timeout is None and self._shared and (kind is None or kind in _FOLLOWED):
            # A long-lived watch: served from the process's one poll of every followed object.
            return self._feed.watch(Interest(kind, name), since, stop, on_undecodable,
                                    lambda at: self._watch_kinds(kinds, at, name, stop, None, on_undecodable))
        return self._watch_kinds(kinds, since, name, stop, timeout, on_undecodable)

    def share_watches(self, pace: float | None = None) -> None:
        # `pace` is etcd's: the feed polls as every watch here does (5 ms after
        # activity, backing off to 50 ms), one poll for all of them.
        self._shared = True

    def _feed_stream(self, since: int, stop: threading.Event,
                     on_undecodable: Callable[[Undecodable], None],
                     inline: Callable[[Callable[[], None]], None],
                     on_progress: Callable[[int], None]) -> Iterator[WatchEvent]:
        # Every followed kind (not the dashboard's history series, large and read
        # by a get); each joined watch logs what it skips, as its own poll would.
        # Nothing to abort (`inline`): the poll waits on `stop`, which closing the feed sets.
        return self._watch_kinds(list(_FOLLOWED), since, None, stop, None, on_undecodable,
                                 log_skipped=False)

    def watch_into(self, kind: str | None, since: int,
                   sink: Callable[[builtins.list[WatchEvent]], None], stop: threading.Event,
                   *, stored: bool = False) -> None:
        kind = kind_of(kind) if kind else None
        if not self._shared or (kind is not None and kind not in _FOLLOWED):
            super().watch_into(kind, since, sink, stop, stored=stored)
            return
        every = stored and kind is None  # every followed kind: what the feed polls
        kinds = [kind] if kind else list(_FOLLOWED if every else KINDS)
        self._feed.watch_into(Interest(kind, stored=every), since, sink, stop, None,
                              lambda at: self._watch_kinds(kinds, at, None, stop, None, None))

    def watch_objects(self, since: int, *, stop: threading.Event | None = None,
                      timeout: float | None = None,
                      on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        # Every write of the store's revision is an object's event here: no
        # progress. A poll of its own, also without a timeout: the shared feed
        # polls the followed kinds only (a server over SQLite catches its
        # Placement snapshot up per request, with a timeout, and never follows).
        return self._watch_kinds(list(STORED_KINDS), since, None, stop, timeout, None)

    def _watch_kinds(self, kinds: builtins.list[str], since: int, name: str | None,
                     stop: threading.Event | None, timeout: float | None,
                     on_undecodable: Callable[[Undecodable], None] | None,
                     log_skipped: bool = True) -> Iterator[WatchEvent]:
        placeholders = ",".join("?" * len(kinds))
        by_name = "" if name is None else "AND e.name = ? "
        names = () if name is None else (name,)
        last = since
        idle_since = time.monotonic()
        pause = 0.005
        while stop is None or not stop.is_set():
            def poll(db: sqlite3.Connection, after: int = last) -> tuple[int, int, builtins.list[Any]]:
                meta = dict(db.execute(
                    "SELECT key, value FROM meta WHERE key IN ('compacted', 'revision')"
                ).fetchall())
                compacted, current = int(meta["compacted"]), int(meta["revision"])
                if current <= after:
                    return compacted, current, []  # nothing written: an idle poll ends here
                # With each event, the object's previous write (its state just
                # before): an index seek per event, decoded only if asked for.
                # The events are found by revision (`+e.kind` keeps SQLite off
                # the (kind, name, rev) index: by it, each poll of a busy kind
                # walked and sorted every event of that kind, 20,000 at 10k hosts).
                rows = db.execute(
                    "SELECT e.rev, e.kind, e.name, e.type, e.body, p.rev, p.body FROM events e "
                    "LEFT JOIN events p ON e.type != 'ADDED' AND p.rev = (SELECT max(q.rev) "
                    "FROM events q WHERE q.kind = e.kind AND q.name = e.name AND q.rev < e.rev) "
                    f"WHERE e.rev > ? AND e.rev <= ? AND +e.kind IN ({placeholders}) {by_name}"
                    "ORDER BY e.rev LIMIT 1000",
                    (after, current, *kinds, *names),
                ).fetchall()
                return compacted, current, rows

            compacted, current, rows = self._read(poll)
            if last < compacted:
                raise Gone(
                    f"watch: revision {last} was compacted (history starts after {compacted}); "
                    "list again and watch from the list's revision"
                )
            # Fewer than the limit: every event of ours up to `current` is in
            # `rows`, and the next poll starts there, not at our last event (an
            # idle kind's polls would walk every other kind's events since).
            caught_up = current if len(rows) < 1000 else 0
            for rev, k, obj_name, etype, body, prev_rev, prev_body in rows:
                last = rev
                try:
                    obj = self._watched(k, obj_name, body, rev)
                except Undecodable as exc:
                    if log_skipped:
                        skipped(exc, "watch")
                    if on_undecodable is not None:
                        on_undecodable(exc)
                    continue
                before = (None if prev_body is None
                          else functools.cache(functools.partial(decode, k, prev_body, prev_rev)))
                yield WatchEvent(type=etype, object=obj, revision=rev, before=before)
            # The shared feed's hand-offs to the watches it served from this poll
            # go out now, once (`handoff`; nothing outside the feed's thread).
            handoff.flush()
            last = max(last, caught_up)
            if rows:
                idle_since = time.monotonic()
                pause = 0.005
                continue
            if timeout is not None and time.monotonic() - idle_since >= timeout:
                return
            # Poll quickly right after activity, then back off to keep idle CPU low.
            if stop is not None:
                stop.wait(pause)
            else:
                time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _watched(self, kind: str, name: str, body: str | bytes, rev: int) -> Resource | Stored:
        """A watch event's object: left undecoded when its seal vouches for the
        stored bytes (`encoding.vouched`), so a watch that only forwards it (the
        API's fan-out), looks at its key (the garbage collector) or passes it
        by (the Placement snapshot) never decodes it, and decoded once for all
        of this store's watches when one does (the fleet index); one this store
        wrote is at hand already. Any other value is decoded now, so that one
        that does not decode is skipped as before (Undecodable)."""
        at = (kind, name, rev)
        value = body.encode() if isinstance(body, str) else body
        raw = vouched(kind, name, value)
        known = self._decoded.get(at)
        read = functools.partial(decode, kind, value, rev, name)  # the name even when the body has none
        if raw is None:
            return known if known is not None else self._decoded.decode(at, read)
        return Stored(kind, name, raw, rev, functools.partial(self._decoded.decode, at, read), known)

    def claim(self, reservation: Reservation, manager: str, check: ClaimCheck) -> Reservation:
        with self._write() as db:
            if self._exists(db, "Reservation", reservation.metadata.name):
                raise AlreadyExists(f"Reservation {reservation.metadata.name!r} already exists")
            self._check_claim(db, reservation, check)
            out = self._put(db, prepare_create(reservation, manager, _now()), "ADDED")
            assert isinstance(out, Reservation)
            return out

    def _check_claim(self, db: sqlite3.Connection, reservation: Reservation, check: ClaimCheck) -> None:
        """`check` on the reservation's host and its other reservations, as
        this transaction sees them."""
        host = self._load(db, "Hypervisor", reservation.spec.hypervisor)
        if not isinstance(host, Hypervisor):
            raise NotFound(f"Hypervisor {reservation.spec.hypervisor!r} not found")
        rows = db.execute(
            "SELECT body, rv FROM objects WHERE kind = 'Reservation' AND host = ?",
            (host.metadata.name,),
        ).fetchall()
        others = [decode("Reservation", body, rv) for body, rv in rows]
        check(host, [o for o in others if isinstance(o, Reservation)])

    def close(self) -> None:
        self._feed.close()
        with self._lock:
            self._db.close()
        with self._marks_lock:
            if self._marks is not None:
                self._marks.close()
