"""The provider graph kept current from the store's watch, so
`GET /allocation_candidates` answers from memory in milliseconds at 10,000
providers instead of listing the store per request.

`ProviderSnapshot.refresh(store)` applies the events since its revision (as
the fleet index does, hvfleet.scheduling.index) and recomputes only the
providers they touch: a Hypervisor or its Reservations → that host's
provider; a ResourceProvider record → that provider; an OvercommitPolicy →
every hypervisor (their allocation ratios); a provider whose value did not
change is no change. `graph()` is one ProviderGraph value per change, and
each names the graph before it and the providers that changed (GraphBasis),
so the candidates index (hvfleet.placement.candidates) is patched for those
providers, in a copy, instead of being built again for 10,000.
What a reservation holds is judged when its host last changed: one that
expires meanwhile still counts until the next event of that host (the
snapshot never offers space a claim would refuse; claims re-check anyway)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from hvfleet.model.errors import Gone
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Reservation
from hvfleet.model.placement import PlacementName, ResourceProvider
from hvfleet.placement.graph import GraphBasis, Provider, ProviderGraph
from hvfleet.placement.records import hypervisor_view, record_view
from hvfleet.placement.standard_names import RESOURCE_CLASSES, TRAITS
from hvfleet.scheduling.placement import provider_uuid
from hvfleet.store.base import Store, WatchEvent


class ProviderSnapshot:
    # What the snapshot follows: the public kinds, then each Placement record kind.
    STREAMS: tuple[str | None, ...] = (None, "ResourceProvider", "PlacementName")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.revision = 0
        self._hosts: dict[str, Hypervisor] = {}
        self._reservations: dict[str, dict[str, Reservation]] = {}  # host -> name -> reservation
        self._policies: dict[str, OvercommitPolicy] = {}
        self._records: dict[str, ResourceProvider] = {}
        self._names: dict[str, PlacementName] = {}
        self._providers: dict[str, Provider] = {}
        self._host_uuid: dict[str, str] = {}
        self._dirty_hosts: set[str] = set()
        self._dirty_records: set[str] = set()
        self._graph: ProviderGraph | None = None
        self._last: ProviderGraph | None = None  # the graph handed out last
        self._uuids: dict[str, str] | None = None  # provider uuid -> hypervisor name
        self._known: tuple[frozenset[str], frozenset[str]] | None = None  # made again when a name changes

    @classmethod
    def from_store(cls, store: Store) -> ProviderSnapshot:
        snap = cls()
        snap.load_from(store)
        return snap

    def load_from(self, store: Store) -> None:
        revision = store.revision()
        self._reset()
        for h in store.list_hypervisors():
            self._hosts[h.name] = h
        for r in store.list_reservations():
            self._reservations.setdefault(r.spec.hypervisor, {})[r.name] = r
        for p in store.list_overcommit_policies():
            self._policies[p.name] = p
        for obj in store.list("ResourceProvider").items:
            if isinstance(obj, ResourceProvider):
                self._records[obj.name] = obj
        for obj in store.list("PlacementName").items:
            if isinstance(obj, PlacementName):
                self._names[obj.name] = obj
        self._dirty_hosts = set(self._hosts)
        # A hypervisor's record (its traits, aggregates) is joined to the
        # host's computed provider, as apply() does: never a provider alone.
        self._dirty_records = {n for n, r in self._records.items() if r.spec.hypervisor is None}
        self.revision = revision

    def apply(self, event: WatchEvent) -> None:
        obj = event.object
        gone = event.type == "DELETED"
        if isinstance(obj, Hypervisor):
            if gone or obj.name not in self._hosts:
                self._uuids = None
            if gone:
                self._hosts.pop(obj.name, None)
            else:
                self._hosts[obj.name] = obj
            self._dirty_hosts.add(obj.name)
        elif isinstance(obj, Reservation):
            mine = self._reservations.setdefault(obj.spec.hypervisor, {})
            if gone:
                mine.pop(obj.name, None)
            else:
                mine[obj.name] = obj
            self._dirty_hosts.add(obj.spec.hypervisor)
        elif isinstance(obj, OvercommitPolicy):
            if gone:
                self._policies.pop(obj.name, None)
            else:
                self._policies[obj.name] = obj
            self._dirty_hosts |= set(self._hosts)
        elif isinstance(obj, ResourceProvider):
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
        else:
            return
        self._graph = None

    def refresh(self, store: Store, settle: float = 0.05) -> None:
        """Catch up with the store (every event up to its current revision).
        An all-kinds watch carries the fleet's public kinds only, so the
        Placement records are followed by watches of their own."""
        with self._lock:
            target = store.revision()
            if target <= self.revision:
                return
            if store.events_at_hand:
                settle = 0.0  # nothing to wait for: a stream without events is done at once
            try:
                for kind in self.STREAMS:
                    for event in store.watch(kind, since=self.revision, timeout=settle):
                        self.apply(event)
                        if event.revision >= target and event.last_of_revision:
                            break
            except Gone:
                self.load_from(store)
            self.revision = max(self.revision, target)

    def graph(self) -> ProviderGraph:
        with self._lock:
            if self._graph is not None and not self._dirty_hosts and not self._dirty_records:
                return self._graph
            now = datetime.now(UTC)
            policies = list(self._policies.values())
            changed: set[str] = set()

            def put(uid: str, provider: Provider) -> None:
                # In place, so the order of the others stays and an unchanged
                # provider is no change at all.
                if self._providers.get(uid) != provider:
                    self._providers[uid] = provider
                    changed.add(uid)

            for name in self._dirty_hosts:
                h = self._hosts.get(name)
                uid = provider_uuid(h) if h is not None else None
                old = self._host_uuid.get(name)
                if old is not None and old != uid:
                    del self._host_uuid[name]
                    if self._providers.pop(old, None) is not None:
                        changed.add(old)
                if h is None or uid is None:
                    continue
                view = hypervisor_view(h, list(self._reservations.get(name, {}).values()), policies,
                                       self._records.get(uid), now)
                put(uid, view.to_graph())
                self._host_uuid[name] = uid
            for uid in self._dirty_records:
                rec = self._records.get(uid)
                if rec is None:
                    if self._providers.pop(uid, None) is not None:
                        changed.add(uid)
                else:
                    put(uid, record_view(rec).to_graph())
            self._dirty_hosts.clear()
            self._dirty_records.clear()
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
        """Provider uuid -> hypervisor name, as of the last refresh (made again
        only when a hypervisor came or went: a host's uid never changes)."""
        with self._lock:
            if self._uuids is None:
                self._uuids = {provider_uuid(h): name for name, h in self._hosts.items()}
            return self._uuids

    def known_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """(resource classes, traits) Placement knows: standard and custom.
        The same two sets until a name is added or removed (they key the
        candidates bodies kept per graph: equal by identity, hashed once)."""
        with self._lock:
            known = self._known
            if known is None:
                custom = list(self._names.values())
                classes = frozenset(RESOURCE_CLASSES) | {n.spec.placement_name for n in custom
                                                         if n.spec.of == "resource-class"}
                traits = TRAITS | {n.spec.placement_name for n in custom if n.spec.of == "trait"}
                known = self._known = (frozenset(classes), frozenset(traits))
            return known
