"""The provider graph kept current, so `GET /allocation_candidates` and
every other Placement read answer from memory in milliseconds at 10,000
providers instead of reading the store per request.

Who owns what. The hypervisors are the fleet index's (hvfleet.scheduling
.index.FleetIndex, the one object a server's `fit` reads too): it follows
the Hypervisors, Reservations, OvercommitPolicies and the agents' Leases,
and keeps beside each host's row that host's root
provider in Placement's units (`HostProvider`: inventories, usages, claims,
readiness), made once per write that touched the host, per Lease change
that turns its readiness and per turn of the clock that changes it (a
holding claim expiring, a Lease lapsing, a heartbeat growing stale), each
with a version. The snapshot follows only what the index does not hold: the
stored Placement records (ResourceProvider: stored providers, and a
hypervisor's traits, aggregates and generation; PlacementName; consumers),
and asks the index for the roots made again since the version it last had.

`ProviderSnapshot.refresh(store)` catches the index up (with the server's
`catch_up`: its fit's), then applies its own events since its revision,
read from one stream of every stored kind (`Store.watch_objects`; the
index's kinds pass by), and recomputes only the providers they touch; a
provider whose value did not change is no change. On a store whose events
are not at hand (etcd) the server has both follow the store in a thread
instead, and a refresh only waits until they have seen the store's current
revision.

Two values come out of it, each made again only after a change and then
shared by every reader: `graph()`, one ProviderGraph per change naming the
graph before it and the providers that changed (GraphBasis), so the
candidates index (hvfleet.placement.candidates) is patched for those
providers instead of being built again for 10,000; and `fleet()`, the
providers' full views (records.Fleet) with lookups by name, consumer, parent
and tree patched per change, for the other GETs, the policy check and the
writes' reads. Both are judged at the time asked (by default the time of
the call), as `fit` and the claim judge it: the index makes a host's root
again when its turn has come, so an expired claim stops counting and a host
whose agent went quiet carries COMPUTE_STATUS_DISABLED at the first request
after, with nothing written."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta

from hvfleet.model.errors import Gone
from hvfleet.model.hypervisor import Reservation
from hvfleet.model.placement import PlacementConsumer, PlacementName, ResourceProvider
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.placement.cow import CowDict
from hvfleet.placement.graph import GraphBasis, Provider, ProviderGraph
from hvfleet.placement.records import Fleet, ProviderView, cut_off, record_view, root_view
from hvfleet.placement.standard_names import RESOURCE_CLASSES, TRAITS
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.placement import HostProvider, provider_uuid
from hvfleet.store.base import Store, WatchEvent
from hvfleet.store.following import follow_in_thread

log = logging.getLogger(__name__)

# How long a refresh waits for the follower to reach the store's revision
# before it answers from what it has (a revision the follower never sees:
# another application's write in a shared etcd, outside hvfleet's prefix;
# hvfleet's own writes beside the objects reach it as progress).
FOLLOW_WAIT_S = 0.5
# The kinds the snapshot follows; the index follows the hosts' kinds.
_RECORD_KINDS = ("ResourceProvider", "PlacementName", "PlacementConsumer")
_STANDARD_CLASSES = frozenset(RESOURCE_CLASSES)


class ProviderSnapshot:
    # What the snapshot follows where the store has no stream of every kind:
    # the public kinds, then each Placement record kind.
    STREAMS: tuple[str | None, ...] = (None, "ResourceProvider", "PlacementName", "PlacementConsumer")

    def __init__(self, index: FleetIndex, catch_up: Callable[[Store, int], object] | None = None) -> None:
        # The fleet index whose hosts are the graph's hypervisor roots: the
        # server's, which its fit reads. `catch_up(store, revision)` brings it
        # up to the store's `revision` (the server's holds the lock its fit
        # holds); by default `index.refresh`, one at a time.
        self.index = index
        if catch_up is None:
            one_at_a_time = threading.Lock()

            def refresh(store: Store, target: int) -> None:
                with one_at_a_time:
                    index.refresh(store, liveness=False, target=target)

            catch_up = refresh
        self._catch_up_index = catch_up
        self._lock = threading.Lock()
        self._seen = threading.Condition(self._lock)
        self._following = False
        self.loads = 0  # whole-store reads (the first, and after lost history)
        self._reset()

    def _reset(self) -> None:
        self.revision = 0
        self._caught_up = 0  # the store revision the last refresh waited for
        # The store's change mark read just before that revision (None: none
        # to trust): while the store's mark stays, the snapshot is current.
        self._mark: int | None = None
        # The index's root providers as of version `_index_version` (None: take
        # them all), by host name: the index's own values, not copies.
        self._index_version: int | None = None
        self._roots: dict[str, HostProvider] = {}
        self._records: dict[str, ResourceProvider] = {}
        self._names: dict[str, PlacementName] = {}
        self._consumers: dict[str, PlacementConsumer] = {}
        self._by_project: dict[str, frozenset[str]] = {}  # project -> consumer names
        self._providers: dict[str, Provider] = {}
        self._views: CowDict[str, ProviderView] = CowDict()
        # Lookups of the views (values are frozensets, never changed in place).
        # Each is handed out as a view no later change alters (hvfleet.placement.cow).
        self._by_name: CowDict[str, frozenset[str]] = CowDict()
        self._by_consumer: CowDict[str, frozenset[str]] = CowDict()
        self._children: CowDict[str, frozenset[str]] = CowDict()
        self._trees: CowDict[str, frozenset[str]] = CowDict()
        self._fleet: Fleet | None = None  # the views handed out last
        self._host_uuid: dict[str, str] = {}
        self._dirty_hosts: set[str] = set()
        self._dirty_records: set[str] = set()
        self._cut_off: frozenset[str] = frozenset()  # stored providers whose root is gone (records.cut_off)
        self._changed: set[str] = set()  # providers changed since the last graph
        self._graph: ProviderGraph | None = None
        self._last: ProviderGraph | None = None  # the graph handed out last
        self._known: tuple[frozenset[str], frozenset[str]] | None = None  # made again when a name changes
        # Custom class -> how many shown providers' inventories name it: a
        # class a hypervisor's computed inventories name exists while they
        # name it (records.inventory_classes), counted per provider change.
        self._in_use: dict[str, int] = {}

    @property
    def staleness(self) -> timedelta:
        """How long a heartbeat may be (hosts without a Lease): the index's."""
        return self.index.staleness

    @classmethod
    def from_store(cls, store: Store, staleness: timedelta = DEFAULT_STALENESS,
                   index: FleetIndex | None = None,
                   catch_up: Callable[[Store, int], object] | None = None) -> ProviderSnapshot:
        """The snapshot of `store` over `index` (by default one of its own,
        loaded from the store: a process without a server's index)."""
        if index is None:
            index = FleetIndex.from_store(store, staleness)
        snap = cls(index, catch_up)
        snap.load_from(store)
        return snap

    def load_from(self, store: Store) -> None:
        revision = store.revision()
        self._reset()
        self.loads += 1
        for kind in _RECORD_KINDS:
            for obj in store.list(kind).items:
                self.apply(WatchEvent(type="ADDED", object=obj, revision=revision))
        # A hypervisor's record (its traits, aggregates) is part of its host's view.
        self._dirty_records = {u for u, r in self._records.items() if r.spec.hypervisor is None}
        self.revision = revision

    def apply(self, event: WatchEvent) -> None:
        """One event of the stored Placement records; the index's kinds
        (Hypervisor, Reservation, OvercommitPolicy, Lease) are the index's to
        follow, and pass by undecoded (`event.kind`: sealed values)."""
        if event.kind not in _RECORD_KINDS:
            return
        obj = event.object
        gone = event.type == "DELETED"
        if isinstance(obj, ResourceProvider):
            if gone:
                self._records.pop(obj.name, None)
            else:
                self._records[obj.name] = obj
            if obj.spec.hypervisor is not None:
                self._dirty_hosts.add(obj.spec.hypervisor)
            else:
                self._dirty_records.add(obj.name)
        elif isinstance(obj, PlacementName):
            if gone:
                self._names.pop(obj.name, None)
            else:
                self._names[obj.name] = obj
            self._known = None
        elif isinstance(obj, PlacementConsumer):
            self._apply_consumer(obj, gone)
        else:
            return
        self._graph = None

    def _apply_consumer(self, obj: PlacementConsumer, gone: bool) -> None:
        old = self._consumers.get(obj.name)
        if old is not None:
            was = old.spec.project_id
            self._by_project[was] = self._by_project.get(was, frozenset()) - {obj.name}
        if gone:
            self._consumers.pop(obj.name, None)
            return
        self._consumers[obj.name] = obj
        now = obj.spec.project_id
        self._by_project[now] = self._by_project.get(now, frozenset()) | {obj.name}

    # -- catching up ----------------------------------------------------------------------

    def _events(self, store: Store, since: int, *, stop: threading.Event | None = None,
                timeout: float | None = None,
                on_progress: Callable[[int], None] | None = None) -> Iterator[WatchEvent]:
        """Every followed event after `since`, in revision order: one stream of
        every kind where the store has one (the event at the store's current
        revision is then always in it, so a catch-up stops there; a revision of
        a write beside the objects comes to `on_progress`), else a stream per
        followed kind."""
        try:
            yield from store.watch_objects(since, stop=stop, timeout=timeout, on_progress=on_progress)
            return
        except NotImplementedError:
            pass
        for kind in self.STREAMS:
            yield from store.watch(kind, since=since, stop=stop, timeout=timeout)

    def refresh(self, store: Store, settle: float = 0.05) -> None:
        """Catch up with the store (every event up to its current revision).
        When the snapshot `follow`s the store, only wait until the follower
        has seen that revision (at most FOLLOW_WAIT_S, the fleet index's
        catch-up first included: a revision neither ever sees, another
        application's write in a shared etcd, is waited for once, not twice)."""
        mark = store.change_mark()  # before the revision: while it stays, so does the revision
        target = store.revision()
        started = time.monotonic()
        self._catch_up_index(store, target)
        with self._lock:
            if target <= max(self.revision, self._caught_up):
                self._mark = mark
                return
            if self._following:
                left = max(0.0, FOLLOW_WAIT_S - (time.monotonic() - started))
                store.follow_now()
                if self._seen.wait_for(lambda: self.revision >= target, left):
                    self._mark = mark
                self._caught_up = target
                return
            if store.events_at_hand:
                settle = 0.0  # nothing to wait for: a stream without events is done at once
            try:
                for event in self._events(store, self.revision, timeout=settle):
                    self.apply(event)
                    self.revision = max(self.revision, event.revision)
                    if event.revision >= target and event.last_of_revision:
                        break
            except Gone:
                self.load_from(store)
            self._caught_up = target
            self._mark = mark

    def kept_graph(self, store: Store) -> ProviderGraph | None:
        """The graph `graph()` would hand out, when it can be had at once and
        `refresh(store)` would change nothing: the store's change mark is the
        one read when the snapshot last caught up (nothing written since, by
        any replica), and there is nothing to recompute (no event applied
        since the last graph, no host whose turn has come: a reservation
        expiring, a Lease lapsing, a heartbeat growing stale). None when not so,
        or when another thread holds the snapshot: then refresh and ask
        `graph()`. Never waits, never reads the store: safe on an event loop."""
        mark = self._mark
        if mark is None or store.change_mark() != mark:
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            graph = self._graph
            if graph is None or self._changed or self._dirty_hosts or self._dirty_records:
                return None
            version = self._index_version
            if version is None or not self.index.placement_settled(version, datetime.now(UTC)):
                return None
            return graph
        finally:
            self._lock.release()

    def kept_known_names(self) -> tuple[frozenset[str], frozenset[str]] | None:
        """`known_names()` when made already (None: ask `known_names`)."""
        return self._known

    def follow(self, store: Store, stop: threading.Event) -> threading.Thread:
        """Apply the store's events as they come, in a thread, until `stop`:
        a refresh then never opens a stream of its own (on etcd, a new stream
        from a past revision gets its history only at etcd's next sync of
        lagging watchers, up to 100 ms later). A write beside the objects (a
        server secret, the history sampler's turn) comes as progress: a
        refresh waiting for its revision need not wait."""

        def events(since: int, progressed: Callable[[int], None]) -> Iterator[WatchEvent]:
            return self._events(store, since, stop=stop, on_progress=progressed)

        with self._lock:
            self._following = True
        return follow_in_thread(self, self._seen, store, stop, events, self.apply,
                                "placement-snapshot-watch")

    # -- the values handed out ------------------------------------------------------------

    @property
    def index_version(self) -> int | None:
        """The version of the index's root providers the snapshot last took
        (`FleetIndex.placement_version` then; None before the first)."""
        return self._index_version

    def _pull_roots(self, now: datetime) -> None:
        """Take the index's root providers made again since the version last
        taken (all of them the first time, or after the index reloaded)."""
        index = self.index
        changes = None
        if self._index_version is not None:
            version, changes = index.placement_roots(self._index_version, now)
        if changes is None:
            version, roots = index.placement_all(now)
            changes = {name: roots.get(name) for name in set(roots) | set(self._roots)}
        self._index_version = version
        for name, root in changes.items():
            if root is None:
                self._roots.pop(name, None)
            else:
                self._roots[name] = root
        self._dirty_hosts |= set(changes)

    def _patch(self, now: datetime) -> None:
        """Recompute the providers the changes since the last patch touched:
        the roots the index made again (a write, a Lease, the clock) and the
        records applied since; call with the lock held."""
        self._pull_roots(now)
        if not self._dirty_hosts and not self._dirty_records:
            return
        self._fleet = None  # its readers keep it as it is (CowDict)
        trees_moved = False  # a root came or went, or a stored provider did or moved
        for name in self._dirty_hosts:
            root = self._roots.get(name)
            uid = root.uuid if root is not None else None
            old = self._host_uuid.get(name)
            if old is not None and old != uid:
                del self._host_uuid[name]
                self._put(old, None)
                trees_moved = True
            if root is None or uid is None:
                continue
            trees_moved = trees_moved or old != uid
            self._put(uid, root_view(root, self._records.get(uid)))
            self._host_uuid[name] = uid
        if trees_moved or any(self._moved(uid) for uid in self._dirty_records):
            # Which stored providers lost their root: looked at again only
            # when a tree changed, not per claim or inventory write.
            cut = cut_off(self._records, set(self._host_uuid.values()))
            self._dirty_records |= cut ^ self._cut_off
            self._cut_off = cut
        for uid in self._dirty_records:
            rec = self._records.get(uid)
            self._put(uid, None if rec is None or uid in self._cut_off else record_view(rec))
        self._dirty_hosts.clear()
        self._dirty_records.clear()

    def _moved(self, uid: str) -> bool:
        """Whether stored provider `uid`'s change may move a tree: it came, went
        or has another parent (or is not shown: cut off from its root)."""
        rec, view = self._records.get(uid), self._views.get(uid)
        return rec is None or view is None or view.parent_uuid != rec.spec.parent_uuid

    def _put(self, uid: str, view: ProviderView | None) -> None:
        """`view` in place of the provider `uid`'s (None: it is gone), its
        lookups patched; a provider whose graph value is the same is no change
        to the graph."""
        old = self._views.get(uid)
        self._count_classes(old, view)
        if old is not None:
            _drop(self._by_consumer, old.consumers, uid)
            _drop(self._children, [old.parent_uuid] if old.parent_uuid else [], uid)
            _drop(self._trees, [old.root_uuid], uid)
            _drop(self._by_name, [old.name], uid)
        if view is None:
            self._views.pop(uid)
            if self._providers.pop(uid, None) is not None:
                self._changed.add(uid)
            return
        self._views[uid] = view
        _add(self._by_consumer, view.consumers, uid)
        _add(self._children, [view.parent_uuid] if view.parent_uuid else [], uid)
        _add(self._trees, [view.root_uuid], uid)
        _add(self._by_name, [view.name], uid)
        provider = view.to_graph()
        # In place, so the order of the others stays and an unchanged
        # provider is no change at all.
        if self._providers.get(uid) != provider:
            self._providers[uid] = provider
            self._changed.add(uid)

    def _count_classes(self, old: ProviderView | None, new: ProviderView | None) -> None:
        """Count the custom classes `new`'s inventories name in place of
        `old`'s; the known names are made again only when a class comes or goes."""
        was = old.inventories.keys() - _STANDARD_CLASSES if old is not None else set()
        now = new.inventories.keys() - _STANDARD_CLASSES if new is not None else set()
        if was == now:
            return
        for c in was - now:
            left = self._in_use[c] - 1
            if left:
                self._in_use[c] = left
            else:
                del self._in_use[c]
                self._known = None
        for c in now - was:
            n = self._in_use.get(c, 0)
            self._in_use[c] = n + 1
            if not n:
                self._known = None

    def fleet(self, now: datetime | None = None) -> Fleet:
        """Every provider's view as of the last refresh, judged at `now` (by
        default the time of the call), with its lookups: one value per
        change, shared by its readers (who must not change it)."""
        with self._lock:
            now = now or datetime.now(UTC)
            self._patch(now)
            if self._fleet is None:
                self._fleet = Fleet(self._views.view(), now, names=self._by_name.view(),
                                    consumer_index=self._by_consumer.view(),
                                    children_index=self._children.view(),
                                    tree_index=self._trees.view())
            return self._fleet

    def consumer(self, name: str) -> PlacementConsumer | None:
        with self._lock:
            return self._consumers.get(name.lower())

    def reservations_of(self, host: str) -> list[Reservation]:
        return self.index.reservations_of(host)

    def project_consumers(self, project_id: str) -> list[PlacementConsumer]:
        with self._lock:
            return [self._consumers[c] for c in sorted(self._by_project.get(project_id, ()))
                    if c in self._consumers]

    def graph(self, now: datetime | None = None) -> ProviderGraph:
        """The providers as the candidates search reads them, judged at `now`
        (by default the time of the call)."""
        with self._lock:
            self._patch(now or datetime.now(UTC))
            if self._graph is not None and not self._changed:
                return self._graph
            changed, self._changed = self._changed, set()
            last = self._last
            if last is not None and not changed:
                self._graph = last
                return last
            basis: GraphBasis | None = None
            if last is not None:
                held = last.basis
                if held is not None and held.previous is not None:
                    # `last` was never indexed: derive from what it was derived from.
                    basis = GraphBasis(held.previous, held.changed | changed)
                else:
                    basis = GraphBasis(last, frozenset(changed))
            self._graph = self._last = ProviderGraph(dict(self._providers), basis)
            return self._graph

    def hypervisor_uuids(self) -> dict[str, str]:
        """Provider uuid -> hypervisor name, as the index has them (made again
        only when a hypervisor came or went: a host's uid never changes)."""
        return self.index.provider_uuids()

    def host_provider(self, host: str) -> str | None:
        """The provider uuid of hypervisor `host`, as the index has it."""
        h = self.index.host(host)
        return None if h is None else provider_uuid(h)

    def known_names(self, now: datetime | None = None) -> tuple[frozenset[str], frozenset[str]]:
        """(resource classes, traits) Placement knows: standard and custom,
        the custom classes being the stored ones and those a provider's
        inventories name (a hypervisor's are computed: `_in_use`), judged at
        `now` as `fleet()`. The same two sets until a name is added or removed
        (they key the candidates bodies kept per graph: equal by identity,
        hashed once)."""
        with self._lock:
            self._patch(now or datetime.now(UTC))
            known = self._known
            if known is None:
                custom = list(self._names.values())
                classes = _STANDARD_CLASSES | self._in_use.keys() | {
                    n.spec.placement_name for n in custom if n.spec.of == "resource-class"}
                traits = TRAITS | {n.spec.placement_name for n in custom if n.spec.of == "trait"}
                known = self._known = (frozenset(classes), frozenset(traits))
            return known


def _drop(index: CowDict[str, frozenset[str]], keys: Iterable[str], uid: str) -> None:
    for k in keys:
        rest = (index.get(k) or frozenset()) - {uid}
        if rest:
            index[k] = rest
        else:
            index.pop(k)


def _add(index: CowDict[str, frozenset[str]], keys: Iterable[str], uid: str) -> None:
    for k in keys:
        index[k] = (index.get(k) or frozenset()) | {uid}

