"""The Store contract every backend keeps (SQLite embedded, etcd distributed).

It is shaped after etcd and the Kubernetes API so both backends map onto it
directly:
- one monotonically increasing store revision; an object's `resourceVersion`
  is the revision of its last write (etcd's mod_revision);
- every update is compare-and-swap on `resourceVersion` (stale → Conflict);
- field ownership is recorded in `metadata.managedFields` and enforced inside
  the same atomic write (see `hvfleet.store.ownership`): an update takes what
  it changes, an apply (`Write.applied`) conflicts with others' fields;
- a write that changes nothing is not written: no new resourceVersion, no
  generation bump, no watch event, on every backend;
- `watch(since=R)` yields every event with revision > R, in order; history
  that was compacted away raises Gone; each event can tell the object's
  previous state (`WatchEvent.previous`);
- `claim()` re-checks a reservation against its host and that host's other
  reservations and writes it in one atomic step, without a global lock;
- `write_all()` writes several objects all-or-nothing (one SQLite
  transaction, one etcd txn comparing every object's revision);
- agent liveness is a small Lease object per hypervisor (`keepalive`,
  `agent_liveness`), written like any other object, so every backend has it;
- `dry_run`, `dry_run_delete` and `dry_run_claim` run a write's checks on the
  current state and write nothing (the API's dryRun), on every backend.
"""

from __future__ import annotations

import builtins
import gc
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, TypeVar, cast

from hvfleet.model.bounds import MAX_LEASE_SECONDS
from hvfleet.model.errors import AlreadyExists, InvalidInput, NotFound
from hvfleet.model.hypervisor import (
    KINDS,
    Hypervisor,
    OvercommitPolicy,
    Reservation,
    Resource,
)
from hvfleet.model.kinds import STRATEGIES, agent_manager, kind_of_model, strategy_of
from hvfleet.model.lease import Lease, lease_live, released, renewed
from hvfleet.model.selectors import Selector, parse_selector
from hvfleet.model.token import AccessToken
from hvfleet.store.errors import ClaimRefused as ClaimRefused
from hvfleet.store.errors import OwnershipConflict as OwnershipConflict
from hvfleet.store.errors import StaleVersion as StaleVersion
from hvfleet.store.undecodable import Undecodable, overwrite

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
# A kind's model, for the typed reads and writes (`get_as`, `list_as`, `update_as`).
T = TypeVar("T", Hypervisor, Reservation, Lease, OvercommitPolicy, AccessToken)
# Renewals of one Lease that may collide (two stores of one agent) before giving up.
_LEASE_ATTEMPTS = 20

# A claim's capacity check: raises (e.g. DoesNotFit) when the reservation no
# longer fits on the host given the host's other reservations.
ClaimCheck = Callable[[Hypervisor, list[Reservation]], None]


class Stored:
    """A watched object not decoded yet: its kind and name (from its key), the
    API's JSON of it (the stored JSON that `hvfleet.store.encoding.vouched`
    vouched for, its resourceVersion spliced in on first use), and how to
    decode it when someone needs the model. Only for values whose seal this
    model code checks: every other value is decoded when it is read, so one
    that does not decode is skipped there (hvfleet.store.undecodable)."""

    __slots__ = ("_decode", "_json", "_raw", "kind", "known", "name", "revision")

    def __init__(self, kind: str, name: str, raw: bytes, revision: int,
                 decode: Callable[[], Resource], known: Resource | None = None) -> None:
        self.kind = kind
        self.name = name
        self.revision = revision
        self._raw = raw
        self._json: bytes | None = None
        self._decode = decode
        # The object when the store has it decoded already (one it wrote itself).
        self.known = known

    def json(self) -> bytes:
        if self._json is None:
            from hvfleet.store.encoding import with_json_version

            self._json = with_json_version(self._raw, self.revision)
        return self._json

    @property
    def raw(self) -> bytes:
        """The stored JSON, without its resourceVersion."""
        return self._raw

    def decoded(self) -> Resource:
        return self._decode()


class WatchEvent:
    """One change of one object. `object` is the model, decoded on first use
    when the backend handed over a `Stored` (the etcd feed does, for values it
    can vouch for): a consumer that needs only the kind and name (`kind`,
    `name`) or the JSON (`object_json`) never decodes it."""

    __slots__ = ("_object", "_stored", "before", "kind", "last_of_revision", "name", "revision", "type")

    def __init__(self, type: EventType, object: Resource | Stored, revision: int,
                 last_of_revision: bool = True, before: Callable[[], Resource] | None = None) -> None:
        self.type = type
        self.revision = revision
        # Several events share a revision when one atomic write (`write_all` on
        # etcd) changed several objects; they are delivered one after the other,
        # and this is True on the last of them. A consumer that stops at a
        # revision must stop only here, or it loses the rest of that write.
        self.last_of_revision = last_of_revision
        # The object as it was just before this event, decoded on first use (only a
        # watch filtering on something that can change, labels, needs it): None
        # when the backend cannot tell. Backends that keep history give it (etcd
        # from prev_kv, SQLite from its event log, which keeps each object's last
        # write below its compaction floor), so a watch resumed from any revision
        # still in history can tell an object leaving a selection from one that
        # was never in it.
        self.before = before
        if isinstance(object, Stored):
            self._object: Resource | None = object.known
            self._stored: Stored | None = object
            self.kind, self.name = object.kind, object.name
        else:
            self._object, self._stored = object, None
            self.kind, self.name = object.kind, object.metadata.name

    @property
    def object(self) -> Resource:
        obj = self._object
        if obj is None:
            assert self._stored is not None
            obj = self._object = self._stored.decoded()
        return obj

    @property
    def stored(self) -> Stored | None:
        """The undecoded object, when the backend handed one over."""
        return self._stored

    @property
    def decoded(self) -> bool:
        """Whether `object` is at hand without a decode."""
        return self._object is not None

    def object_json(self) -> bytes:
        """The object's JSON as the API sends it (equal in content to
        `object.to_json()`), without a decode when the backend vouched for
        the stored bytes."""
        if self._stored is not None:
            return self._stored.json()
        return self.object.to_json()

    def with_last(self, last_of_revision: bool) -> WatchEvent:
        """This event, `last_of_revision` as given (undecoded if it was)."""
        out = WatchEvent.__new__(WatchEvent)
        for slot in WatchEvent.__slots__:
            setattr(out, slot, getattr(self, slot))
        out.last_of_revision = last_of_revision
        return out

    def __eq__(self, other: builtins.object) -> bool:
        if not isinstance(other, WatchEvent):
            return NotImplemented
        return (self.type, self.revision, self.last_of_revision, self.object) == \
            (other.type, other.revision, other.last_of_revision, other.object)

    __hash__ = None  # type: ignore[assignment]  # as the frozen dataclass of a model: unhashable

    def __repr__(self) -> str:
        return (f"WatchEvent(type={self.type!r}, kind={self.kind!r}, name={self.name!r}, "
                f"revision={self.revision}, last_of_revision={self.last_of_revision})")

    @property
    def knows_previous(self) -> bool:
        """Whether `previous()` can answer (an ADDED object had no previous state)."""
        return self.type == "ADDED" or self.before is not None

    def previous(self) -> Resource | None:
        """The object just before this event: None when it did not exist (ADDED).
        Only when `knows_previous`."""
        if self.type == "ADDED":
            return None
        if self.before is None:
            raise LookupError("this store does not tell an event's previous state")
        return self.before()


WriteAction = Literal["create", "update", "delete"]
# A field as managedFields records it: ("spec", "overcommit", "cpu"),
# ("metadata", "labels", "az"), ("status",).
FieldPath = tuple[str, ...]


@dataclass(frozen=True)
class Write:
    """One object of an atomic batch (`Store.write_all`): `create` it (it must
    not exist), or `update` it by compare-and-swap on the resourceVersion it
    carries, exactly as `Store.create` and `Store.update` would.

    `applied` makes the write a server-side apply (managedFields operation
    Apply) of a configuration naming exactly these fields: the manager's
    applied fields become exactly these, and changing a field another manager
    owns is an OwnershipConflict unless forced. Without it the write is an
    Update: it succeeds whoever owned what, and takes what it changes
    (hvfleet.store.ownership).

    `delete` removes the object named, if its resourceVersion (when the object
    carries one) is still current. `check` makes the create of a Reservation a
    claim, as `Store.claim` makes one: `check(its host, the host's other
    reservations as the batch leaves them)` runs inside the atomic write and
    its refusal refuses the batch (the deletes of the batch come first, in
    order, so a claim that replaces another sees it gone)."""

    action: WriteAction
    object: Resource
    applied: frozenset[FieldPath] | None = None
    check: ClaimCheck | None = None


@dataclass(frozen=True)
class ListResult:
    items: list[Resource]
    # The store revision the list was read at: watch(since=revision) continues
    # from exactly this point without gaps.
    revision: int
    # Objects of the kind (matching the selector, where their labels can be
    # read) that were skipped because they do not decode (hvfleet.store.undecodable).
    undecodable: list[Undecodable] = field(default_factory=list)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Decode many objects without the cyclic GC running over and over.

    Decoding 10k objects allocates millions of small acyclic containers; each
    allocation burst triggers generation-2 scans of everything alive, which made
    a list of 10k hypervisors 4-5x slower. Reference counting frees them all."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def kind_of(kind: str) -> str:
    """Normalise 'hypervisors'/'hypervisor'/'Hypervisor' to the kind name. Access
    tokens are accepted (the backends store them) but not offered in the message."""
    k = kind.strip().lower()
    for name, strategy in STRATEGIES.items():
        if k in strategy.names():
            return name
    raise InvalidInput(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")


def fleet_kind_of(kind: str) -> str:
    """kind_of for what users list, export and apply: the public kinds only, so
    access tokens never appear there (their records are for `hvfleet token`)."""
    name = kind_of(kind)
    if not STRATEGIES[name].public:
        raise InvalidInput(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")
    return name


def check_batch(writes: Sequence[Write]) -> None:
    """A batch names each object at most once (the order of two writes of one
    object inside one atomic step would mean nothing); a check only on the
    create of a Reservation."""
    seen: set[tuple[str, str]] = set()
    for w in writes:
        key = (w.object.kind, w.object.metadata.name)
        if key in seen:
            raise InvalidInput(f"{key[0]} {key[1]}: appears more than once in one atomic write")
        seen.add(key)
        if w.check is not None and not (w.action == "create" and isinstance(w.object, Reservation)):
            raise InvalidInput(f"{key[0]} {key[1]}: a claim check goes with the create of a Reservation")


def in_batch(reservations: Sequence[Reservation], host: str, writes: Sequence[Write],
             upto: int) -> list[Reservation]:
    """`host`'s reservations as the first `upto` writes of a batch leave them
    (those deleted dropped, those created or updated there taken), for the
    check of the claim at `upto`."""
    by_name = {r.metadata.name: r for r in reservations}
    for w in writes[:upto]:
        obj = w.object
        if not isinstance(obj, Reservation):
            continue
        if w.action == "delete":
            by_name.pop(obj.metadata.name, None)
        elif obj.spec.hypervisor == host:
            by_name[obj.metadata.name] = obj
        else:
            by_name.pop(obj.metadata.name, None)
    return list(by_name.values())


def check_overwrite(stored: Undecodable, new: Resource) -> None:
    """An update over an undecodable object names the version stored (the
    compare-and-swap of every update): StaleVersion otherwise."""
    rv = new.metadata.resource_version
    if rv is None:
        raise InvalidInput(
            f"{new.kind} {new.metadata.name}: metadata.resourceVersion is required for an update"
        )
    if rv != str(stored.revision):
        raise StaleVersion(
            f"{new.kind} {new.metadata.name}: resourceVersion {rv} is stale "
            f"(current is {stored.revision}); re-read and retry"
        )


def changed_parts(old: Resource, new: Resource) -> tuple[bool, bool]:
    """(whether `new` changes the status of `old`, whether it changes anything
    else): which of the main resource and its /status subresource a write is."""
    kind = strategy_of(new)
    if not kind.has_status:
        return False, new != old
    status_changed = kind.status_of(new) != kind.status_of(old)
    return status_changed, new.model_copy(update={"status": kind.status_of(old)}) != old


def as_selector(selector: Selector | str | None) -> Selector:
    return selector if isinstance(selector, Selector) else parse_selector(selector)


class Store(ABC):
    """The contract. Backends implement the abstract methods; the typed helpers
    below are shared."""

    url: str
    # Whether `delete` itself keeps an object with finalizers (marking it), as
    # the remote store's server does; else hvfleet.store.lifecycle does it.
    finalizes_on_delete: bool = False
    # Whether a watch from a revision not after `revision()` yields every event
    # up to it on its first read (SQLite reads its event table), so a reader
    # catching up needs no time for events to arrive (`watch(timeout=0)`).
    events_at_hand: bool = False

    @abstractmethod
    def get(self, kind: str, name: str) -> Resource:
        """The object, or NotFound."""

    @abstractmethod
    def list(self, kind: str, selector: Selector | str | None = None) -> ListResult:
        """Objects of `kind` whose labels match `selector`, sorted by name."""

    @abstractmethod
    def create(self, obj: Resource, manager: str) -> Resource:
        """Create; AlreadyExists if the name is taken. Sets uid, creationTimestamp,
        generation 1, resourceVersion and managedFields."""

    @abstractmethod
    def update(self, obj: Resource, manager: str, *, force: bool = False) -> Resource:
        """Compare-and-swap on obj.metadata.resourceVersion (required): stale →
        Conflict. An Update: it takes ownership of the fields it changes (status
        writer and agent rules still apply); `force` is for applies. A write
        that changes nothing returns the stored object as it is."""

    @abstractmethod
    def delete(self, kind: str, name: str, resource_version: str | None = None) -> None:
        """Delete; with a resourceVersion, only if it is still current."""

    def watch(
        self,
        kind: str | None = None,
        since: int = 0,
        *,
        name: str | None = None,
        stop: threading.Event | None = None,
        timeout: float | None = None,
        on_undecodable: Callable[[Undecodable], None] | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> Iterator[WatchEvent]:
        """Events with revision > since, in revision order, until `stop` is set or
        `timeout` seconds pass without an event. Gone if `since` was compacted.
        With `name` (and `kind`), only that object's events: an agent watching
        its own Hypervisor must not receive every other host's writes. An event
        whose object does not decode is skipped (logged and counted) and handed
        to `on_undecodable`, where the backend can tell (SQLite, etcd; not the
        remote store, whose server skips it). A backend whose revision also
        moves with writes beside the objects (etcd: server secrets) may hand
        such a revision to `on_progress`, once every event before it was
        yielded, so a reader catching up to the store's revision can stop there
        (`watch_objects` says the same)."""
        if name is not None and not kind:
            raise InvalidInput("watch: a name needs a kind")
        return self._watch(kind_of(kind) if kind else None, since, name, stop, timeout,
                           on_undecodable, on_progress)

    def watch_into(self, kind: str | None, since: int, sink: Callable[[builtins.list[WatchEvent]], None],
                   stop: threading.Event, *, stored: bool = False) -> None:
        """`watch(kind, since, stop=stop)`, each revision's events (a list, in
        order) handed to `sink`, until `stop` is set; raises what `watch`
        raises. With `stored` (and no kind): every followed kind, the public
        ones and the others (Placement's records, tokens; `KindStrategy.followed`),
        where the backend has one stream of them all (`watch_objects`), else
        the public ones. A backend that serves its watches from one shared stream
        (`share_watches`) may call `sink` on that stream's thread, so `sink`
        must be quick and never wait (the API's fan-out only queues events
        for its clients): no thread of the caller is woken per event."""
        group: builtins.list[WatchEvent] = []
        for event in self._into_events(kind, since, stop, stored):
            if not stored or STRATEGIES[event.kind].followed:
                group.append(event)
            if event.last_of_revision:
                if group:
                    sink(group if group[-1].last_of_revision else [*group[:-1], group[-1].with_last(True)])
                group = []

    def _into_events(self, kind: str | None, since: int, stop: threading.Event,
                     stored: bool) -> Iterator[WatchEvent]:
        if stored and kind is None:
            try:
                yield from self.watch_objects(since, stop=stop)
                return
            except NotImplementedError:  # raised before any event: the remote store
                pass
        yield from self.watch(kind, since=since, stop=stop)

    def watch_objects(self, since: int, *, stop: threading.Event | None = None,
                      timeout: float | None = None,
                      on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        """`watch` of every stored kind, the public ones and the others
        (Placement's records, tokens), in one stream in revision order: the
        event of any write of objects is in it, so a reader catching up to a
        revision knows when it has it. A backend whose revision also moves
        with writes beside the objects (etcd: server secrets) hands each such
        revision to `on_progress`, in order with the events, once every event
        before it was yielded. NotImplementedError where the backend has no
        such stream (the remote store)."""
        raise NotImplementedError(f"store {self.url} has no stream of every kind")

    @abstractmethod
    def _watch(self, kind: str | None, since: int, name: str | None, stop: threading.Event | None,
               timeout: float | None,
               on_undecodable: Callable[[Undecodable], None] | None,
               on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        """`watch` of one kind (its name as objects carry it) or, with None, of
        every public kind; a name only with a kind."""

    @abstractmethod
    def revision(self) -> int:
        """The store's current revision."""

    def ready(self) -> None:
        """Nothing when the store answers a read now; Unavailable when it does
        not (a server's /readyz). By default one read of the revision."""
        self.revision()

    def change_mark(self) -> int | None:
        """A number that is the same as at an earlier call only if nothing was
        written to the store in between (by this process or any other), read
        at once: no round trip, no waiting for a lock another thread holds.
        None when it cannot be had so (then ask `revision`): etcd (only a
        round trip tells), or the answer would have to wait. Read a mark
        before `revision`: while the mark stays, so does that revision."""
        return None

    def share_watches(self, pace: float | None = None) -> None:
        """Say that this process keeps many long-lived watches (a server: its
        watch fan-outs, garbage collector, token records): a backend may then
        serve them all from one stream of every object (etcd) instead of a
        stream each. Not for a process that watches a few objects (an agent):
        it would receive every write. Nothing changes in what a watch sees.
        `pace` (seconds, None: the backend's default): that stream may be
        read at most once per `pace` while writes come faster, events then
        reaching the watches up to `pace` late (etcd: FEED_PACE_S)."""
        return None

    def follow_now(self) -> None:
        """A reader is about to wait until the shared stream reaches a
        revision: a backend that paces it reads it now."""
        return None

    def get_for_write(self, kind: str, name: str, resource_version: str | None) -> Resource:
        """`get`, for a write that names the version it replaces: a backend that
        still holds that version of the object from its own last read or write
        may answer from it without a round trip (etcd). Nothing taken from it
        can count stale: the write either finds that version still current or
        fails its compare-and-swap (StaleVersion)."""
        return self.get(kind, name)

    # -- a write awaited on an event loop ---------------------------------------------
    # A backend whose one round trip of an update can be awaited on an event
    # loop (etcd's gateway) lets a server make a write whose stored object is at
    # hand (an agent's Lease renewal) without crossing to a worker thread and
    # back (docs/scaling.md, "The lease fast path"). Every other backend keeps
    # `update` in a thread.
    writes_on_loop: bool = False

    def at_hand(self, kind: str, name: str, resource_version: str | None) -> Resource | None:
        """The object at `resource_version` when this store holds it already
        (its own last read or write, decoded), without I/O; None otherwise.
        As for `get_for_write`, the write's compare-and-swap is what decides."""
        return None

    async def update_on_loop(self, current: Resource, obj: Resource, manager: str, *,
                             force: bool = False) -> Resource:
        """`update` of `obj` over `current` (the stored object at the version
        `obj` names, from `at_hand`), awaited on the running event loop: the
        same ownership rules, compare-and-swap and errors, the same object
        answered and the same watch events. Only where `writes_on_loop`."""
        raise NotImplementedError(f"store {self.url} writes in a thread, not on an event loop")

    # -- what the servers over this store share -------------------------------------

    def server_secret(self, name: str) -> tuple[bytes, int] | None:
        """A value every `hvfleet serve` over this store shares (the serving CA),
        with its version; None while it is not set. Kept apart from every kind:
        no list, watch, export or API role reaches it, only a process that holds
        the store's own credentials. NotImplementedError on a backend that keeps
        none (the remote store: its server has its own)."""
        raise NotImplementedError(f"store {self.url} keeps no server secrets")

    def put_server_secret(self, name: str, value: bytes, replaces: int | None) -> bool:
        """Set `name` if its version is still `replaces` (None: only if it is not
        set yet), atomically; False when another writer came first."""
        raise NotImplementedError(f"store {self.url} keeps no server secrets")

    def list_at(self, kind: str, revision: int, selector: Selector | str | None = None) -> ListResult:
        """The objects of `kind` as they were at `revision` (not newer than the
        current one), from the store's history (hvfleet.store.history); Gone
        once that history is compacted, RevisionNotReached for a newer one."""
        from hvfleet.store.history import list_at  # history builds on this module

        return list_at(self, kind, revision, selector)

    @abstractmethod
    def claim(self, reservation: Reservation, manager: str, check: ClaimCheck) -> Reservation:
        """Create `reservation` only if `check(host, other reservations of that
        host)` passes on the state it is written against, atomically."""

    @abstractmethod
    def write_all(
        self, writes: Sequence[Write], manager: str, *, force: bool = False
    ) -> builtins.list[Resource]:
        """Every write of `writes`, as `manager`, all or nothing: either each one
        passes the checks `create`/`update` make (absent for a create; current
        resourceVersion, field ownership and status writer for an update) against
        one state of the store and all are written in one atomic step, or the
        first one that fails raises its error (AlreadyExists, NotFound,
        StaleVersion, OwnershipConflict, Forbidden, InvalidInput) and nothing is
        written. No reader ever sees part of a batch. Returns the objects as
        stored, in order. An object may appear only once in a batch."""

    def close(self) -> None:  # noqa: B027 - optional for backends
        """Release connections."""

    # -- dry runs (the API's dryRun=All): a write's checks, written nowhere ------------------
    #
    # Every backend's write is: read the stored object, check existence and the
    # resourceVersion, then `prepare_create`/`prepare_update` (field ownership,
    # status writer, agents and spec, reservation growth), then commit. A dry run
    # is the same steps on the current state without the commit, so its answer
    # and its refusals are the ones the write would give now.

    def dry_run(self, write: Write, manager: str, *, force: bool = False) -> Resource:
        """The object `write_all([write])` would store now (a create has no
        resourceVersion yet, an update keeps the current one), or the error it
        would raise; nothing is written."""
        from hvfleet.store.ownership import prepare_create, prepare_update

        obj = write.object
        now = datetime.now(UTC).replace(microsecond=0)
        try:
            old: Resource | None = self.get(obj.kind, obj.metadata.name)
        except NotFound:
            old = None
        except Undecodable as exc:
            if write.action == "create":
                raise AlreadyExists(f"{obj.kind} {obj.metadata.name!r} already exists") from None
            check_overwrite(exc, obj)
            out = overwrite(exc, obj, manager, now)
            meta = out.metadata.model_copy(update={"resource_version": str(exc.revision)})
            return out.model_copy(update={"metadata": meta})
        if write.action == "create":
            if old is not None:
                raise AlreadyExists(f"{obj.kind} {obj.metadata.name!r} already exists")
            return prepare_create(obj, manager, now, write.applied)
        if old is None:
            raise NotFound(f"{obj.kind} {obj.metadata.name!r} not found")
        new = prepare_update(old, obj, manager, force=force, now=now, applied=write.applied)
        meta = new.metadata.model_copy(update={"resource_version": old.metadata.resource_version})
        return new.model_copy(update={"metadata": meta})

    def dry_run_delete(self, kind: str, name: str, resource_version: str | None = None) -> Resource:
        """The object `delete` would remove now, or the error it would raise."""
        kind = kind_of(kind)
        current = self.get(kind, name)
        if resource_version is not None and resource_version != current.metadata.resource_version:
            raise StaleVersion(
                f"{kind} {name}: resourceVersion {resource_version} is stale "
                f"(current is {current.metadata.resource_version})"
            )
        return current

    def dry_run_claim(self, reservation: Reservation, manager: str, check: ClaimCheck) -> Reservation:
        """The reservation `claim` would write now, after the same checks in the
        same order (the host exists, the name is free, `check` passes on the
        host and its reservations), or the error it would raise."""
        from hvfleet.store.ownership import prepare_create

        try:
            host = self.get_as(Hypervisor, reservation.spec.hypervisor)
        except NotFound:
            raise NotFound(f"Hypervisor {reservation.spec.hypervisor!r} not found") from None
        try:
            self.get("Reservation", reservation.metadata.name)
        except NotFound:
            pass
        else:
            raise AlreadyExists(f"Reservation {reservation.metadata.name!r} already exists")
        others = [r for r in self.list_reservations()
                  if r.spec.hypervisor == host.metadata.name]
        check(host, others)
        out = prepare_create(reservation, manager, datetime.now(UTC).replace(microsecond=0))
        assert isinstance(out, Reservation)
        return out

    # -- agent liveness: Lease objects (hvfleet.model.lease), on every backend --------------

    def keepalive(self, name: str, ttl: int) -> Lease:
        """The agent of hypervisor `name` is alive: renew (or take) the Lease `name`
        for `ttl` seconds, as `agent/<name>`. If it stops calling this, readers
        see it not live `ttl` seconds after the last renewal. One small object
        write; the Hypervisor's status is not touched. The Lease this store
        wrote last is renewed by CAS without reading it first; if anything else
        wrote it since (another process of the same agent), it is read again."""
        if not 1 <= ttl <= MAX_LEASE_SECONDS:
            raise InvalidInput(f"{ttl} must be from 1 to {MAX_LEASE_SECONDS} seconds",
                               field="leaseDurationSeconds")
        holder = agent_manager(name)
        held = self._held_leases()
        current = held.get(name)
        must_read = current is None
        last: StaleVersion | AlreadyExists | NotFound | None = None
        for attempt in range(_LEASE_ATTEMPTS):
            if must_read:
                try:
                    current = self.get_as(Lease, name)
                except NotFound:
                    current = None
            new = renewed(current, name, holder, ttl, datetime.now(UTC))
            try:
                out = self.create(new, holder) if current is None else self.update(new, holder)
            except (StaleVersion, AlreadyExists, NotFound) as exc:
                last, must_read = exc, True  # written or deleted by someone else since
                held.pop(name, None)
                self.pause_after_conflict(attempt)
                continue
            assert isinstance(out, Lease)
            held[name] = out
            return out
        assert last is not None
        raise last

    def _held_leases(self) -> dict[str, Lease]:
        """The Leases this store object last wrote, by name."""
        held: dict[str, Lease] | None = self.__dict__.get("_held")
        if held is None:
            held = self.__dict__.setdefault("_held", {})
        return held

    def release(self, name: str) -> None:
        """The agent of `name` stops cleanly: its Lease is released, so it is not
        live from now on (rather than one lease duration later)."""
        self._held_leases().pop(name, None)

        with suppress(NotFound):
            self.update_as(Lease, name, released, agent_manager(name))

    def agent_leases(self) -> dict[str, Lease]:
        """Every hypervisor agent's Lease, by hypervisor name."""
        return {o.metadata.name: o for o in self.list_as(Lease)}

    def agent_liveness(self, now: datetime | None = None) -> dict[str, bool]:
        """For each hypervisor whose agent has held a Lease: whether it is live
        (`lease_live`). Hosts not listed have no lease information."""
        at = now or datetime.now(UTC)
        return {name: lease_live(lease, at) for name, lease in self.agent_leases().items()}

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- typed conveniences ---------------------------------------------------------

    # A backend decodes every object with the model of its stored kind
    # (`KindStrategy.model`), so what `get` and `list` return for a kind is of
    # that kind's model: these say so to the type checker, once.

    def get_as(self, model: type[T], name: str) -> T:
        """`get` of the kind whose model is `model`."""
        return cast(T, self.get(kind_of_model(model), name))

    def list_as(self, model: type[T], selector: Selector | str | None = None) -> builtins.list[T]:
        """`list(...).items` of the kind whose model is `model`."""
        return cast(builtins.list[T], self.list(kind_of_model(model), selector).items)

    def update_as(self, model: type[T], name: str, mutate: Callable[[T], T], manager: str, *,
                  force: bool = False, as_apply: bool = False) -> T:
        """`update_with_retry` of the kind whose model is `model`."""
        def typed(obj: Resource) -> Resource:
            return mutate(cast(T, obj))

        return cast(T, self.update_with_retry(kind_of_model(model), name, typed, manager,
                                              force=force, as_apply=as_apply))

    def get_hypervisor(self, name: str) -> Hypervisor:
        return self.get_as(Hypervisor, name)

    def list_hypervisors(self, selector: Selector | str | None = None) -> builtins.list[Hypervisor]:
        return self.list_as(Hypervisor, selector)

    def list_reservations(self, selector: Selector | str | None = None) -> builtins.list[Reservation]:
        return self.list_as(Reservation, selector)

    def list_overcommit_policies(self) -> builtins.list[OvercommitPolicy]:
        return self.list_as(OvercommitPolicy)

    def update_with_retry(
        self,
        kind: str,
        name: str,
        mutate: Callable[[Resource], Resource],
        manager: str,
        *,
        force: bool = False,
        attempts: int = 50,
        as_apply: bool = False,
    ) -> Resource:
        """Read, apply `mutate`, write with CAS; on a stale version re-read and retry.
        `as_apply`: write a person's edit as an apply of what it changes
        (`ownership.applied_after_edit`), so a field another manager owns is an
        OwnershipConflict unless forced; else an Update, which takes what it
        changes. Ownership conflicts are not retried: they need a person's decision."""
        from hvfleet.store.ownership import applied_after_edit

        last: StaleVersion | None = None
        for attempt in range(attempts):
            old = self.get(kind, name)
            new = mutate(old)
            try:
                if as_apply:
                    applied = applied_after_edit(old, new, manager)
                    return self.write_all([Write("update", new, applied)], manager, force=force)[0]
                return self.update(new, manager, force=force)
            except StaleVersion as exc:
                last = exc
            self.pause_after_conflict(attempt)
        assert last is not None
        raise last

    def pause_after_conflict(self, attempt: int) -> None:  # noqa: B027 - optional hook
        """Called after the `attempt`-th stale write of a retry loop. SQLite
        serialises writers on its lock, so retrying at once is right there."""

    def update_hypervisor(
        self,
        name: str,
        mutate: Callable[[Hypervisor], Hypervisor],
        manager: str,
        *,
        force: bool = False,
        as_apply: bool = False,
    ) -> Hypervisor:
        return self.update_as(Hypervisor, name, mutate, manager, force=force, as_apply=as_apply)
