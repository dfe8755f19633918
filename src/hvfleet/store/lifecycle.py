"""An object's life as Kubernetes' generic registry runs it, for every backend:
generated names, finalizers (a deletion that waits) and owner references
(dependents collected when their owners are gone).

The rules a write must keep (`on_create`, `on_update`) run inside every
backend's atomic write, through `prepare_create` / `prepare_update`
(hvfleet.store.ownership), so no writer can break them:
- `deletionTimestamp` is set only by a deletion and never changes or goes
  away once set (a write that carries another value keeps the stored one);
- while an object is being deleted, no finalizer can be added;
- an owner reference names a kind this store keeps.

The operations built on the Store contract (`create_named`, `delete`,
`update`) are what the edges call instead of the bare store calls: a
DELETE of an object with finalizers only marks it (deletionTimestamp), and the
write that removes its last finalizer deletes it. `GarbageCollector` follows
the store's watch and deletes an object once none of its owners exists any
more (kube's background propagation), through the same `delete`, so a
dependent's own finalizers hold it as they would any deletion.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from hvfleet.model.errors import AlreadyExists, Gone, HvfleetError, InvalidInput, NotFound
from hvfleet.model.hypervisor import KINDS, STORED_KINDS, Resource
from hvfleet.model.kinds import strategy
from hvfleet.model.meta import (
    API_VERSION,
    GENERATED_SUFFIX_LENGTH,
    MAX_GENERATE_NAME_PREFIX,
    OwnerReference,
)
from hvfleet.store.base import StaleVersion, Store, WatchEvent, Write

log = logging.getLogger("hvfleet.store.lifecycle")

# kube's utilrand alphabet: no vowels (no words), no look-alikes (0/o, 1/l).
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Names tried for one generateName create before giving up (kube tries 8).
GENERATE_ATTEMPTS = 8
# The manager of the collector's own writes.
COLLECTOR = "hvfleet-garbage-collector"
# The finalizers of a deletion that propagates (kube's metav1.FinalizerOrphanDependents
# and FinalizerDeleteDependents): the collector removes each when its work is done.
ORPHAN = "orphan"
FOREGROUND = "foregroundDeletion"
Propagation = Literal["Orphan", "Background", "Foreground"]
PROPAGATIONS: tuple[Propagation, ...] = ("Orphan", "Background", "Foreground")


# -- the rules every write keeps (called by prepare_create / prepare_update) ---------------

def _check_owner_references(obj: Resource) -> None:
    for i, ref in enumerate(obj.metadata.owner_references or []):
        if ref.api_version != API_VERSION or ref.kind not in KINDS:
            raise InvalidInput(f"{ref.api_version} {ref.kind}: an owner must be one of this "
                               f"server's kinds ({API_VERSION}: {', '.join(KINDS)})",
                               field=f"metadata.ownerReferences[{i}]")
        if ref.kind == obj.kind and ref.name == obj.metadata.name:
            raise InvalidInput("an object cannot own itself", field=f"metadata.ownerReferences[{i}]")


def on_create(obj: Resource) -> Resource:
    """The object as a create may store it: named, owners of known kinds, and
    not being deleted (a client cannot create a deleted object)."""
    if not obj.metadata.name:
        raise InvalidInput("name or generateName is required", field="metadata.name")
    _check_owner_references(obj)
    if obj.metadata.deletion_timestamp is None and obj.metadata.deletion_grace_period_seconds is None:
        return obj
    meta = obj.metadata.model_copy(update={"deletion_timestamp": None,
                                           "deletion_grace_period_seconds": None})
    return obj.model_copy(update={"metadata": meta})


def on_update(old: Resource, new: Resource) -> Resource:
    """`new` as an update may store it over `old` (see the module's rules)."""
    if new.metadata.owner_references != old.metadata.owner_references:
        _check_owner_references(new)
    deleting = old.metadata.deletion_timestamp
    if deleting is None:
        return new
    added = sorted(set(new.metadata.finalizers or []) - set(old.metadata.finalizers or []))
    if added:
        raise InvalidInput(f"no new finalizers can be added if the object is being deleted, "
                           f"found new finalizers {added}", field="metadata.finalizers")
    if (new.metadata.deletion_timestamp == deleting
            and new.metadata.deletion_grace_period_seconds == old.metadata.deletion_grace_period_seconds):
        return new
    meta = new.metadata.model_copy(update={
        "deletion_timestamp": deleting,
        "deletion_grace_period_seconds": old.metadata.deletion_grace_period_seconds})
    return new.model_copy(update={"metadata": meta})


# -- generated names ----------------------------------------------------------------------

def generated_name(prefix: str) -> str:
    """`prefix` (cut to leave room) and five random characters, as kube-apiserver
    names an object created with metadata.generateName."""
    suffix = "".join(secrets.choice(_ALPHABET) for _ in range(GENERATED_SUFFIX_LENGTH))
    return prefix[:MAX_GENERATE_NAME_PREFIX] + suffix


def create_named(obj: Resource, write: Callable[[Resource], Resource],
                 attempts: int = GENERATE_ATTEMPTS) -> Resource:
    """`write(obj)` (a create, a claim, or their dry run); when `obj` has no name
    but a generateName, with a generated name, and another on a collision."""
    prefix = obj.metadata.generate_name
    if obj.metadata.name or not prefix:
        return write(obj)
    for _ in range(attempts):
        meta = obj.metadata.model_copy(update={"name": generated_name(prefix)})
        try:
            return write(obj.model_copy(update={"metadata": meta}))
        except AlreadyExists:
            continue
    raise AlreadyExists(f"{obj.kind}: no unused name from generateName {prefix!r} after "
                        f"{attempts} attempts; retry")


# -- deletion that waits for finalizers -----------------------------------------------------

def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def propagation_finalizers(finalizers: list[str] | None, propagation: Propagation | None) -> list[str]:
    """The finalizers a deletion with `propagation` leaves (kube-apiserver's
    rules): Orphan adds `orphan`, Foreground `foregroundDeletion`, each
    dropping the other; Background drops both; None (not given) keeps them."""
    have = list(finalizers or [])
    if propagation is None:
        return have
    have = [f for f in have if f not in (ORPHAN, FOREGROUND)]
    if propagation == "Orphan":
        have.append(ORPHAN)
    elif propagation == "Foreground":
        have.append(FOREGROUND)
    return have


def delete(store: Store, current: Resource, manager: str, resource_version: str | None = None,
           *, dry_run: bool = False, propagation: Propagation | None = None) -> tuple[Resource, bool]:
    """Delete `current` (as read; `resource_version` the version the caller
    names, else the one read) — or, while it has finalizers, mark it with a
    deletionTimestamp and keep it. Returns the object as it is now and whether
    it is gone. A dry run answers the same and writes nothing.

    `propagation` (kube's DeleteOptions.propagationPolicy; None is Background,
    kube's default for these kinds): what becomes of the objects that name
    `current` as their owner. Background: the collector deletes them after it.
    Orphan: the collector takes the owner reference out of each, then lets
    the owner go (the `orphan` finalizer holds it until then). Foreground:
    the collector deletes them first, and the owner goes once none is left
    (`foregroundDeletion`)."""
    rv = resource_version or current.metadata.resource_version
    kind, name = current.kind, current.metadata.name
    if store.finalizes_on_delete and not dry_run:
        if propagation not in (None, "Background"):
            raise InvalidInput(f"{propagation}: a store behind an API server deletes with the "
                               "server's default propagation (Background)", field="propagationPolicy")
        store.delete(kind, name, rv)
        try:
            return store.get(kind, name), False  # kept, marked, for its finalizers
        except NotFound:
            return current, True
    if current.metadata.deletion_timestamp is not None:
        return current, False  # already being deleted: nothing more to do
    finalizers = propagation_finalizers(current.metadata.finalizers, propagation)
    if finalizers:
        meta = current.metadata.model_copy(update={
            "deletion_timestamp": _now(), "deletion_grace_period_seconds": 0, "resource_version": rv,
            "finalizers": finalizers})
        marked = current.model_copy(update={"metadata": meta})
        if dry_run:
            return store.dry_run(Write("update", marked), manager), False
        return store.update(marked, manager), False
    if dry_run:
        return store.dry_run_delete(kind, name, rv), False
    store.delete(kind, name, rv)
    return current, True


def deletion_kept(current: Resource, new: Resource) -> Resource:
    """`new` with the stored deletion fields: only a deletion sets these, and a
    client's write keeps the stored ones."""
    keep = {"deletion_timestamp": current.metadata.deletion_timestamp,
            "deletion_grace_period_seconds": current.metadata.deletion_grace_period_seconds}
    if any(getattr(new.metadata, k) != v for k, v in keep.items()):
        new = new.model_copy(update={"metadata": new.metadata.model_copy(update=keep)})
    return new


def update(store: Store, current: Resource, new: Resource, write: Callable[[Resource], Resource],
           *, dry_run: bool = False) -> Resource:
    """`write(new)` — the caller's compare-and-swap write of `new` over `current`
    (Store.update, a batch, or their dry run) — keeping the stored deletion
    fields whatever the client sent; when the object is being deleted and this
    write leaves it without finalizers, it is deleted right after (its last
    state is returned)."""
    out = write(deletion_kept(current, new))
    if not dry_run and out.metadata.deletion_timestamp is not None and not out.metadata.finalizers:
        # Deleted meanwhile, or changed again: that write decides.
        with contextlib.suppress(NotFound, StaleVersion):
            store.delete(out.kind, out.metadata.name, out.metadata.resource_version)
    return out


# -- garbage collection of dependents ------------------------------------------------------

def _owner_exists(store: Store, ref: OwnerReference) -> bool:
    try:
        return store.get(ref.kind, ref.name).metadata.uid == ref.uid
    except NotFound:
        return False


def collect(store: Store, obj: Resource) -> bool:
    """Delete `obj` if it has owners and none of them exists any more (as the
    collector's own deletion, which its finalizers hold like any other).
    Returns whether it asked for the deletion."""
    refs = obj.metadata.owner_references or []
    if not refs or any(_owner_exists(store, r) for r in refs):
        return False
    try:
        current = store.get(obj.kind, obj.metadata.name)
        if current.metadata.uid != obj.metadata.uid:
            return False
        delete(store, current, COLLECTOR)
    except (NotFound, StaleVersion):
        return False  # gone or changed meanwhile: the next event looks again
    return True


def _names_owners(event: WatchEvent) -> bool:
    """Whether the event's object names owners; told from the stored JSON
    when the event was not decoded (an owner reference is always written as
    `"ownerReferences":[{`, so an object without that text has none)."""
    stored = event.stored
    if stored is not None and not event.decoded and _OWNED not in stored.raw:
        return False
    return bool(event.object.metadata.owner_references)


_OWNED = b'"ownerReferences":[{'
# How many times the collector reads and writes an object again after losing a race.
_ATTEMPTS = 10


def _propagates(obj: Resource) -> bool:
    """Whether `obj` is being deleted with a finalizer the collector removes."""
    meta = obj.metadata
    return (meta.deletion_timestamp is not None and bool(meta.uid)
            and any(f in (ORPHAN, FOREGROUND) for f in meta.finalizers or []))


def _may_propagate(event: WatchEvent) -> bool:
    """`_propagates`, told from the stored JSON when the event was not decoded."""
    stored = event.stored
    if stored is not None and not event.decoded and not (
            b'"deletionTimestamp"' in stored.raw and (b'"orphan"' in stored.raw
                                                     or b'"foregroundDeletion"' in stored.raw)):
        return False
    return _propagates(event.object)


def _rewrite(store: Store, kind: str, name: str, uid: str,
             change: Callable[[Resource], Resource | None]) -> None:
    """`change` the object `kind/name` (while it is the one of `uid`) as the
    collector, reading it again after a lost race; `change` answers None when
    there is nothing to do."""
    for _ in range(_ATTEMPTS):
        try:
            current = store.get(kind, name)
        except NotFound:
            return
        new = change(current)
        if (uid and current.metadata.uid != uid) or new is None:
            return
        try:
            update(store, current, new, lambda o: store.update(o, COLLECTOR))
            return
        except (StaleVersion, NotFound):
            continue
    raise StaleVersion(f"{kind}/{name}: changed {_ATTEMPTS} times while the collector wrote it; "
                       "it is looked at again at its next event")


def _disown(store: Store, kind: str, name: str, owner_uid: str) -> None:
    """Take the owner `owner_uid` out of `kind/name`'s owner references (an orphan)."""

    def change(current: Resource) -> Resource | None:
        refs = current.metadata.owner_references or []
        kept = [r for r in refs if r.uid != owner_uid]
        if len(kept) == len(refs):
            return None
        meta = current.metadata.model_copy(update={"owner_references": kept or None})
        return current.model_copy(update={"metadata": meta})

    _rewrite(store, kind, name, "", change)


def _drop_finalizer(store: Store, kind: str, name: str, uid: str, finalizer: str) -> None:
    """Take `finalizer` off `kind/name` (of `uid`): deleted if it was the last."""

    def change(current: Resource) -> Resource | None:
        have = current.metadata.finalizers or []
        if finalizer not in have:
            return None
        meta = current.metadata.model_copy(update={"finalizers": [f for f in have if f != finalizer]})
        return current.model_copy(update={"metadata": meta})

    _rewrite(store, kind, name, uid, change)


class GarbageCollector:
    """Follows the store's watch of every kind and deletes dependents whose
    owners are all gone: on start-up, every such object (what was left while
    no collector ran), then each time an owner is deleted. Deletion is in the
    background, as kube-apiserver's default propagation: the owner's DELETE
    does not wait for it.

    Most writes concern no owner and no dependent (a status write, a Lease
    renewal): the watch's events are sorted where they arrive (`_sort`, on
    the store's shared stream's thread where it has one) and only the few
    that can matter wake the collector's worker: a deletion, an object that
    names owners, or one that named owners before."""

    def __init__(self, store: Store, retry: float = 1.0) -> None:
        self.store = store
        self.retry = retry
        self._stop = threading.Event()
        # uid of an owner -> (kind, name) of the objects that name it, and back.
        self._dependents: dict[str, set[tuple[str, str]]] = {}
        self._owners_of: dict[tuple[str, str], set[str]] = {}
        # uid of an owner deleted in the foreground, waiting for its dependents -> (kind, name).
        self._foreground: dict[str, tuple[str, str]] = {}
        # Keys that named owners at their last event `_sort` passed on (only `_sort` uses it).
        self._named_owners: set[tuple[str, str]] = set()
        self._position = 0  # the revision `_sort` has passed (the watch resumes after it)
        # For the worker: events to act on, a call (the sweep), or None to stop.
        self._work: queue.SimpleQueue[list[WatchEvent] | Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="garbage-collector", daemon=True)
        self._worker = threading.Thread(target=self._collect, name="garbage-collector-work",
                                        daemon=True)

    def start(self) -> GarbageCollector:
        self._worker.start()
        self._thread.start()
        return self

    def _track(self, obj: Resource, present: bool) -> None:
        key = (obj.kind, obj.metadata.name)
        for uid in self._owners_of.pop(key, set()):
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(key)
                if not deps:
                    del self._dependents[uid]
        if present and obj.metadata.owner_references:
            uids = {r.uid for r in obj.metadata.owner_references}
            self._owners_of[key] = uids
            for uid in uids:
                self._dependents.setdefault(uid, set()).add(key)

    def _sweep(self) -> int:
        """Index every object with owners, collect the orphans; the revision read at.
        Only the kinds the collector follows (`KindStrategy.followed`): the
        dashboard's history series are never owned, and reading them all at
        once held every point of every host in memory."""
        self._dependents.clear()
        self._owners_of.clear()
        self._foreground.clear()
        revision = self.store.revision()
        propagating: list[Resource] = []
        for kind in STORED_KINDS:
            if not strategy(kind).followed:
                continue
            for obj in self.store.list(kind).items:
                if obj.metadata.owner_references:
                    self._track(obj, True)
                    collect(self.store, obj)
                if _propagates(obj):
                    propagating.append(obj)
        self._named_owners = set(self._owners_of)
        for owner in propagating:  # deletions a collector left unfinished
            self._propagate(owner)
        return revision

    def _sort(self, events: list[WatchEvent]) -> None:
        """Pass on to the worker the events that can matter to it (quick; never waits)."""
        passed: list[WatchEvent] = []
        for event in events:
            if not strategy(event.kind).followed:  # never owned, never an owner
                continue
            key = (event.kind, event.name)
            if event.type != "DELETED" and _names_owners(event):
                self._named_owners.add(key)
            elif key in self._named_owners:
                self._named_owners.discard(key)
            elif event.type != "DELETED" and not _may_propagate(event):
                continue
            passed.append(event)
        if passed:
            self._work.put(passed)
        self._position = events[-1].revision

    def _collect(self) -> None:
        while True:
            events = self._work.get()
            if events is None:
                return
            if callable(events):
                events()
                continue
            for event in events:
                try:
                    self._handle(event)
                except HvfleetError as exc:
                    log.warning("garbage collector: %s", exc)
                except Exception:  # never let one bad object stop collection for good
                    log.exception("garbage collector: unexpected error")

    def _handle(self, event: WatchEvent) -> None:
        obj = event.object
        owned_by = self._owners_of.get((obj.kind, obj.metadata.name), set())
        self._track(obj, event.type != "DELETED")
        if event.type == "DELETED" and obj.metadata.uid:
            self._foreground.pop(obj.metadata.uid, None)
            for kind, name in sorted(self._dependents.pop(obj.metadata.uid, set())):
                with contextlib.suppress(NotFound):
                    collect(self.store, self.store.get(kind, name))
        elif obj.metadata.owner_references and event.type == "ADDED":
            collect(self.store, obj)  # created with an owner already gone
        if event.type != "DELETED" and _propagates(obj):
            self._propagate(obj)
        for uid in owned_by:  # a dependent gone or disowned: its owner may go now
            if uid in self._foreground and not self._dependents.get(uid):
                kind, name = self._foreground.pop(uid)
                _drop_finalizer(self.store, kind, name, uid, FOREGROUND)

    def _propagate(self, owner: Resource) -> None:
        """An owner being deleted with `orphan` or `foregroundDeletion`: its
        dependents disowned, or deleted; the finalizer dropped once that is
        done (for Foreground, when the last dependent is gone)."""
        uid = owner.metadata.uid or ""  # `_propagates`: it has one
        finalizers = owner.metadata.finalizers or []
        dependents = sorted(self._dependents.get(uid, set()))
        if ORPHAN in finalizers:
            for kind, name in dependents:
                _disown(self.store, kind, name, uid)
            _drop_finalizer(self.store, owner.kind, owner.metadata.name, uid, ORPHAN)
        elif FOREGROUND in finalizers:
            if not dependents:
                _drop_finalizer(self.store, owner.kind, owner.metadata.name, uid, FOREGROUND)
                return
            self._foreground[uid] = (owner.kind, owner.metadata.name)
            for kind, name in dependents:
                with contextlib.suppress(NotFound, StaleVersion):
                    delete(self.store, self.store.get(kind, name), COLLECTOR)

    def _run(self) -> None:
        since: int | None = None
        while not self._stop.is_set():
            try:
                if since is None:
                    since = self._swept()
                self._position = since
                try:
                    # Every followed kind: a Placement provider in a
                    # hypervisor's tree is owned by that Hypervisor.
                    self.store.watch_into(None, since, self._sort, self._stop, stored=True)
                finally:
                    since = self._position
            except Gone:
                since = None  # history compacted past us: index everything again
            except HvfleetError as exc:
                log.warning("garbage collector: %s; retrying", exc)
                self._stop.wait(self.retry)
            except Exception:  # never let one bad object stop collection for good
                log.exception("garbage collector: unexpected error; retrying")
                self._stop.wait(self.retry)

    def _swept(self) -> int:
        """`_sweep` in the worker, after what it was doing (the two share the index)."""
        done: queue.SimpleQueue[int | BaseException] = queue.SimpleQueue()

        def sweep() -> None:
            try:
                done.put(self._sweep())
            except BaseException as exc:
                done.put(exc)

        self._work.put(sweep)
        got = done.get()
        if isinstance(got, BaseException):
            raise got
        return got

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._work.put(None)
        self._worker.join(timeout=5)
