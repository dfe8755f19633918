"""Placement's view of the store: every resource provider (each Hypervisor, as a
root provider whose inventories are computed live as `placement export`
computes them, and each stored ResourceProvider record), with its usages and
allocations; custom resource classes and traits; consumers.

One read (`read_fleet`) gives a consistent-enough snapshot for one request:
the writes that must not race (allocations, inventories, traits, aggregates)
are compare-and-swap on the records they change (hvfleet.store.base.Write),
or claims (Store.claim) on a hypervisor, so a stale read is refused at write
time, never written."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from hvfleet.model.errors import NotFound
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Reservation
from hvfleet.model.lease import Lease
from hvfleet.model.meta import validate_name
from hvfleet.model.placement import PlacementConsumer, PlacementName, ResourceProvider
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.placement.graph import Inventory, Provider, ProviderGraph
from hvfleet.placement.standard_names import RESOURCE_CLASSES, TRAITS
from hvfleet.scheduling.placement import HostProvider, host_provider, provider_uuid
from hvfleet.scheduling.placement import units_of as units_of  # hvfleet.placement.allocations reads it here
from hvfleet.store.base import Store

if TYPE_CHECKING:
    from hvfleet.placement.allocations import AllocationWriter
    from hvfleet.placement.snapshot import ProviderSnapshot

# Where Placement shows no timestamp of its own (a computed view), the time of the answer.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_text() -> str:
    return datetime.now(UTC).isoformat()


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        out = datetime.fromisoformat(text)
    except ValueError:
        return None
    return out if out.tzinfo else out.replace(tzinfo=UTC)


def name_key(of: str, name: str) -> str:
    """The store name of a custom trait or resource class record: CUSTOM_FOO_BAR
    → trait.custom-foo-bar (Placement's names are [A-Z0-9_], so this is one to
    one). A name that spelling cannot carry (Placement takes up to 255
    characters, and a name may end in '_'; a store name is at most 253 and
    ends in a letter or digit) is keyed by its digest, `trait.h-<sha256>`,
    which no spelled key can be (those start `custom-`)."""
    key = f"{of}.{name.lower().replace('_', '-')}"
    try:
        return validate_name(key)
    except ValueError:
        return f"{of}.h-{hashlib.sha256(name.encode()).hexdigest()}"


@dataclass
class ProviderView:
    uuid: str
    name: str
    generation: int
    parent_uuid: str | None
    root_uuid: str
    inventories: dict[str, Inventory]
    # consumer -> resource class -> amount
    allocations: dict[str, dict[str, int]]
    traits: frozenset[str]
    aggregates: tuple[str, ...]  # in the order they were set
    created: datetime | None
    updated: datetime | None
    record: ResourceProvider | None = None
    hypervisor: Hypervisor | None = None
    # What libvirt shows in use beyond any claim (a hypervisor's status.allocation).
    unclaimed: dict[str, int] = field(default_factory=dict)
    # A hypervisor's allocations as their consumers made them (its claims while
    # Pending, Active or Confirmed), where `allocations` is what they hold now:
    # once an instance shows in libvirt, its claim holds only what libvirt cannot
    # see, but Placement's clients still read the allocation they made.
    made: dict[str, dict[str, int]] | None = None
    # A hypervisor's readiness when the view was made (`host_readiness`): False
    # puts COMPUTE_STATUS_DISABLED among its traits. True for stored providers.
    ready: bool = True

    @property
    def consumers(self) -> dict[str, dict[str, int]]:
        """consumer -> resource class -> amount, as GET /allocations shows it."""
        return self.allocations if self.made is None else self.made

    @property
    def usages(self) -> dict[str, int]:
        out: dict[str, int] = dict(self.unclaimed)
        for resources in self.allocations.values():
            for rc, n in resources.items():
                out[rc] = out.get(rc, 0) + n
        return out

    def to_graph(self) -> Provider:
        return Provider(uuid=self.uuid, name=self.name, generation=self.generation,
                        parent_uuid=self.parent_uuid, root_uuid=self.root_uuid,
                        inventories=self.inventories, usages=self.usages,
                        traits=self.traits, aggregates=frozenset(self.aggregates))


# The trait nova-compute puts on its node's provider while the service is
# disabled; Nova's scheduler asks for roots without it (compute_status_filter).
COMPUTE_STATUS_DISABLED = "COMPUTE_STATUS_DISABLED"


def hypervisor_view(h: Hypervisor, reservations: list[Reservation], policies: list[OvercommitPolicy],
                    record: ResourceProvider | None, now: datetime, lease: Lease | None = None,
                    staleness: timedelta = DEFAULT_STALENESS) -> ProviderView:
    """The provider of `h` at `now`. It carries COMPUTE_STATUS_DISABLED while
    the host may take no new guest (maintenance, Ready not True, its agent's
    `lease` lapsed, or without a Lease no heartbeat younger than `staleness`),
    as `fit` and a claim judge it (`host_readiness`)."""
    return root_view(host_provider(h, reservations, policies, now, lease, staleness), record)


def root_view(root: HostProvider, record: ResourceProvider | None) -> ProviderView:
    """A hypervisor's provider: what its host decides (`root`, as
    hvfleet.scheduling.placement.host_provider made it: inventories, usages,
    claims, readiness) with what its stored record adds (traits, aggregates,
    generation)."""
    h = root.hypervisor
    created = h.metadata.creation_timestamp
    spec = record.spec if record is not None else None
    return ProviderView(
        uuid=root.uuid, name=h.name, generation=spec.generation if spec else 0,
        parent_uuid=None, root_uuid=root.uuid,
        inventories={rc: Inventory(**fields) for rc, fields in root.inventories.items()},
        allocations=root.allocations,
        traits=(frozenset(spec.traits) if spec else frozenset()) | (_ENABLED if root.ready else _DISABLED),
        aggregates=tuple(spec.aggregates) if spec else (),
        created=created, updated=parse_time(spec.updated_at) if spec else created,
        record=record, hypervisor=h, unclaimed=root.unclaimed, made=root.made, ready=root.ready,
    )


_ENABLED: frozenset[str] = frozenset()
_DISABLED = frozenset({COMPUTE_STATUS_DISABLED})


def record_view(rec: ResourceProvider) -> ProviderView:
    s = rec.spec
    return ProviderView(
        uuid=rec.name, name=s.provider_name, generation=s.generation, parent_uuid=s.parent_uuid,
        root_uuid=s.root_uuid or rec.name,
        inventories={rc: Inventory(total=i.total, reserved=i.reserved, min_unit=i.min_unit,
                                   max_unit=i.max_unit, step_size=i.step_size,
                                   allocation_ratio=i.allocation_ratio)
                     for rc, i in s.inventories.items()},
        allocations={c: dict(r) for c, r in s.allocations.items()},
        traits=frozenset(s.traits), aggregates=tuple(s.aggregates),
        created=parse_time(s.created_at), updated=parse_time(s.updated_at), record=rec,
    )


@dataclass
class Fleet:
    """Every provider, by uuid, read at one time: by `read_fleet` from the
    store, or handed out by the server's provider snapshot
    (hvfleet.placement.snapshot), which keeps the lookups below patched per
    change so a request needs no pass over the fleet. Not to be changed by
    its reader (a snapshot's is shared)."""

    providers: Mapping[str, ProviderView]
    now: datetime
    # name -> uuids (one, unless a Hypervisor took a stored provider's name),
    # consumer -> provider uuids it has allocations on, parent uuid -> child
    # uuids, root uuid -> the uuids of its tree: built on first use unless given.
    names: Mapping[str, frozenset[str]] | None = None
    consumer_index: Mapping[str, frozenset[str]] | None = None
    children_index: Mapping[str, frozenset[str]] | None = None
    tree_index: Mapping[str, frozenset[str]] | None = None

    def provider(self, uuid: str) -> ProviderView:
        from hvfleet.placement.errors import PlacementNotFound

        p = self.providers.get(uuid)
        if p is None:
            raise PlacementNotFound(f"No resource provider with uuid {uuid} found")
        return p

    def all_named(self, name: str) -> list[ProviderView]:
        if self.names is None:
            self.names = _index((p.name, p.uuid) for p in self.providers.values())
        return [self.providers[u] for u in sorted(self.names.get(name, ())) if u in self.providers]

    def named(self, name: str) -> ProviderView | None:
        found = self.all_named(name)
        return found[0] if found else None

    def allocations_of(self, consumer_uuid: str) -> dict[str, dict[str, int]]:
        """provider uuid -> resource class -> amount, for one consumer."""
        if self.consumer_index is None:
            self.consumer_index = index_consumers(self.providers.values())
        out = {}
        for u in sorted(self.consumer_index.get(consumer_uuid, ())):
            p = self.providers.get(u)
            if p is not None and consumer_uuid in p.consumers:
                out[u] = dict(p.consumers[consumer_uuid])
        return out

    def children(self, uuid: str) -> frozenset[str]:
        if self.children_index is None:
            self.children_index = index_children(self.providers.values())
        return self.children_index.get(uuid, frozenset())

    def tree(self, root_uuid: str) -> frozenset[str]:
        """Every provider uuid of the tree whose root is `root_uuid`."""
        if self.tree_index is None:
            self.tree_index = index_trees(self.providers.values())
        return self.tree_index.get(root_uuid, frozenset())

    def descendants(self, uuid: str) -> set[str]:
        out: set[str] = set()
        todo = [uuid]
        while todo:
            for c in self.children(todo.pop()):
                if c not in out:
                    out.add(c)
                    todo.append(c)
        return out

    def graph(self) -> ProviderGraph:
        return ProviderGraph({u: p.to_graph() for u, p in self.providers.items()})


def _index(pairs: Iterable[tuple[str, str]]) -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for key, uuid in pairs:
        out.setdefault(key, set()).add(uuid)
    return {k: frozenset(v) for k, v in out.items()}


def index_consumers(views: Iterable[ProviderView]) -> dict[str, frozenset[str]]:
    return _index((c, p.uuid) for p in views for c in p.consumers)


def index_children(views: Iterable[ProviderView]) -> dict[str, frozenset[str]]:
    return _index((p.parent_uuid, p.uuid) for p in views if p.parent_uuid is not None)


def index_trees(views: Iterable[ProviderView]) -> dict[str, frozenset[str]]:
    return _index((p.root_uuid, p.uuid) for p in views)


def cut_off(records: Mapping[str, ResourceProvider], roots: Container[str]) -> frozenset[str]:
    """The stored providers (`records` without `spec.hypervisor`, by uuid)
    whose tree no longer reaches its root, `roots` being the hypervisor
    providers' uuids: a provider above them is gone. A Hypervisor deleted in
    hvfleet while a client's providers hung under it (nova-compute's pGPU
    providers under its node) leaves such a tree; so would a parent deleted
    while a child was being created under it, two writes no one store write
    orders. Placement never shows a provider whose root is gone (its tree
    goes with the root), so no view shows these: the collector deletes their
    records (each names its tree's Hypervisor as owner, `tree_owner`)."""
    reaches: dict[str, bool] = {}

    def walk(uid: str) -> bool:
        path: list[str] = []
        u: str | None = uid
        while True:
            if u is None:  # a stored root
                ok = True
                break
            known = reaches.get(u)
            if known is not None:
                ok = known
                break
            if u in roots:
                ok = True
                break
            rec = records.get(u)
            if rec is None or rec.spec.hypervisor is not None or u in path:
                ok = False  # gone, a gone host's own record, or a loop
                break
            path.append(u)
            u = rec.spec.parent_uuid
        for p in path:
            reaches[p] = ok
        return ok

    return frozenset(u for u, r in records.items() if r.spec.hypervisor is None and not walk(u))


def read_fleet(store: Store, now: datetime | None = None, staleness: timedelta = DEFAULT_STALENESS) -> Fleet:
    now = now or datetime.now(UTC)
    records = [r for r in store.list("ResourceProvider").items if isinstance(r, ResourceProvider)]
    leases = store.agent_leases()
    hosts = store.list_hypervisors()
    reservations = store.list_reservations()
    policies = store.list_overcommit_policies()
    by_host: dict[str, list[Reservation]] = {}
    for r in reservations:
        by_host.setdefault(r.spec.hypervisor, []).append(r)
    providers: dict[str, ProviderView] = {}
    hv_records = {r.name: r for r in records if r.spec.hypervisor is not None}
    for h in hosts:
        uid = provider_uuid(h)
        providers[uid] = hypervisor_view(h, by_host.get(h.name, []), policies, hv_records.get(uid), now,
                                         leases.get(h.name), staleness)
    gone = cut_off({r.name: r for r in records}, providers.keys())
    for rec in records:
        if rec.spec.hypervisor is None and rec.name not in gone:
            providers[rec.name] = record_view(rec)
    return Fleet(providers, now)


@dataclass
class Source:
    """Where the core reads Placement's view from: the store, and, in the
    server, its provider snapshot (`snapshot(catch_up)`), whose fleet is
    patched per change. Without one, each read is a read of the whole store
    (`read_fleet`), as a one-off caller wants. A server's sources share one
    `writer`, where its allocation writes are grouped."""

    store: Store
    snapshot: Callable[[bool], ProviderSnapshot] | None = None
    writer: AllocationWriter | None = None

    def settled(self) -> Source:
        """This source caught up once, for the reads a write makes before it
        writes (each then needs no catch-up of its own: on etcd, a question
        to etcd)."""
        if self.snapshot is None:
            return self
        snap = self.snapshot(True)
        return Source(self.store, lambda _catch_up: snap)

    def fleet(self) -> Fleet:
        """Every provider, caught up with every write made before the call."""
        return read_fleet(self.store) if self.snapshot is None else self.snapshot(True).fleet()

    def hosts(self) -> Mapping[str, str] | None:
        """Provider uuid -> hypervisor name, where a snapshot knows it."""
        return None if self.snapshot is None else self.snapshot(False).hypervisor_uuids()

    def known_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """(resource classes, traits): the standard ones and the custom ones."""
        if self.snapshot is not None:
            return self.snapshot(True).known_names()
        classes = set(resource_classes(self.store))
        classes |= inventory_classes(read_fleet(self.store).providers.values())
        return frozenset(classes), frozenset(traits(self.store))

    def consumer(self, uuid: str) -> PlacementConsumer | None:
        if self.snapshot is not None:
            return self.snapshot(True).consumer(uuid)
        return consumer(self.store, uuid)

    def reservations_of(self, host: str) -> list[Reservation]:
        if self.snapshot is not None:
            return self.snapshot(True).reservations_of(host)
        return [r for r in self.store.list_reservations() if r.spec.hypervisor == host]

    def project_consumers(self, project_id: str) -> list[PlacementConsumer]:
        if self.snapshot is not None:
            return self.snapshot(True).project_consumers(project_id)
        return [c for c in consumers(self.store).values() if c.spec.project_id == project_id]


def custom_names(store: Store, of: str) -> dict[str, PlacementName]:
    return {n.spec.placement_name: n for n in store.list("PlacementName").items
            if isinstance(n, PlacementName) and n.spec.of == of}


def resource_classes(store: Store) -> dict[str, PlacementName | None]:
    """Every resource class: the standard ones (None) and the custom ones (their record)."""
    out: dict[str, PlacementName | None] = dict.fromkeys(RESOURCE_CLASSES)
    out.update(custom_names(store, "resource-class"))
    return out


def inventory_classes(views: Iterable[ProviderView]) -> set[str]:
    """The classes the providers' inventories name. In Placement a class
    exists before any inventory of it; a hypervisor's inventories are
    computed (a custom resource in its `spec.extraCapacity`, its hugepages),
    so the classes they name exist while they name them, no stored copy."""
    return {rc for p in views for rc in p.inventories}


def in_placement_order(classes: Iterable[str]) -> list[str]:
    """Resource classes as Placement lists them: the standard ones in their
    order, then the custom ones in the order of their records' names."""
    standard = set(RESOURCE_CLASSES)
    custom = sorted((c for c in classes if c not in standard), key=lambda c: name_key("resource-class", c))
    return [*RESOURCE_CLASSES, *custom]


def traits(store: Store) -> dict[str, PlacementName | None]:
    out: dict[str, PlacementName | None] = dict.fromkeys(sorted(TRAITS))
    out.update(custom_names(store, "trait"))
    return out


def consumer(store: Store, uuid: str) -> PlacementConsumer | None:
    try:
        obj = store.get("PlacementConsumer", uuid.lower())
    except NotFound:
        return None
    except Exception:  # a consumer id that is no store name cannot be stored either
        return None
    return obj if isinstance(obj, PlacementConsumer) else None


def consumers(store: Store) -> dict[str, PlacementConsumer]:
    return {c.name: c for c in store.list("PlacementConsumer").items if isinstance(c, PlacementConsumer)}


def latest(times: Mapping[str, datetime | None] | list[datetime | None], default: datetime) -> datetime:
    values = [t for t in (times.values() if isinstance(times, Mapping) else times) if t is not None]
    return max(values) if values else default
