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

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hvfleet.model.capacity import held_resources
from hvfleet.model.errors import NotFound
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Reservation
from hvfleet.model.placement import PlacementConsumer, PlacementName, ResourceProvider
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.placement.graph import Inventory, Provider, ProviderGraph
from hvfleet.placement.standard_names import RESOURCE_CLASSES, TRAITS
from hvfleet.scheduling.placement import export_inventories, export_usages, provider_uuid
from hvfleet.store.base import Store

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
    → trait.custom-foo-bar (Placement's names are [A-Z0-9_], so this is one to one)."""
    return f"{of}.{name.lower().replace('_', '-')}"


def units_up(r: ResourceName, q: Quantity) -> int:
    return math.ceil(q.value / r.placement.base_per_unit)


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


def _hypervisor_allocations(h: Hypervisor, reservations: list[Reservation],
                            now: datetime) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in reservations:
        held = held_resources(r, h, now)
        for name, q in held.items():
            if q > 0:
                mine = out.setdefault(r.spec.consumer, {})
                rc = name.placement.resource_class
                mine[rc] = mine.get(rc, 0) + units_up(name, q)
    return out


def hypervisor_view(h: Hypervisor, reservations: list[Reservation], policies: list[OvercommitPolicy],
                    record: ResourceProvider | None, now: datetime) -> ProviderView:
    uid = provider_uuid(h)
    inventories = {rc: Inventory(**fields) for rc, fields in export_inventories(h, policies).items()}
    allocations = _hypervisor_allocations(h, reservations, now)
    total = export_usages(h, reservations, now)
    claimed: dict[str, int] = {}
    for resources in allocations.values():
        for rc, n in resources.items():
            claimed[rc] = claimed.get(rc, 0) + n
    unclaimed = {rc: n - claimed.get(rc, 0) for rc, n in total.items() if n > claimed.get(rc, 0)}
    created = h.metadata.creation_timestamp
    spec = record.spec if record is not None else None
    return ProviderView(
        uuid=uid, name=h.name, generation=spec.generation if spec else 0,
        parent_uuid=None, root_uuid=uid, inventories=inventories, allocations=allocations,
        traits=frozenset(spec.traits) if spec else frozenset(),
        aggregates=tuple(spec.aggregates) if spec else (),
        created=created, updated=parse_time(spec.updated_at) if spec else created,
        record=record, hypervisor=h, unclaimed=unclaimed,
    )


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
    """Every provider, by uuid, read at one time."""

    providers: dict[str, ProviderView]
    hypervisor_records: dict[str, ResourceProvider]
    now: datetime

    def provider(self, uuid: str) -> ProviderView:
        from hvfleet.placement.errors import PlacementNotFound

        p = self.providers.get(uuid)
        if p is None:
            raise PlacementNotFound(f"No resource provider with uuid {uuid} found")
        return p

    def by_name(self) -> dict[str, ProviderView]:
        return {p.name: p for p in self.providers.values()}

    def graph(self) -> ProviderGraph:
        return ProviderGraph({u: p.to_graph() for u, p in self.providers.items()})


def read_fleet(store: Store, now: datetime | None = None) -> Fleet:
    now = now or datetime.now(UTC)
    records = [r for r in store.list("ResourceProvider").items if isinstance(r, ResourceProvider)]
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
        providers[uid] = hypervisor_view(h, by_host.get(h.name, []), policies, hv_records.get(uid), now)
    for rec in records:
        if rec.spec.hypervisor is None:
            providers[rec.name] = record_view(rec)
    return Fleet(providers, hv_records, now)


def read_providers(store: Store, uuids: Iterable[str], hosts: Mapping[str, str],
                   reservations: list[Reservation], names: Iterable[str] = (),
                   now: datetime | None = None) -> Fleet:
    """Only the providers `uuids` (those that exist) and the hypervisors
    `names`, each read as `read_fleet` reads it: a stored record by its uuid,
    a hypervisor by its name (for a uuid, its name in `hosts`: provider uuid
    -> host name, from the server's provider snapshot; a host that no longer
    has that uid is not it), with its share of `reservations` (the store's).
    For a write touching a few providers of a large fleet: what it does not
    read it does not write, and what it writes is compare-and-swap or a claim
    checked inside the write, so a stale `hosts` cannot overbook."""
    now = now or datetime.now(UTC)
    policies: list[OvercommitPolicy] | None = None
    providers: dict[str, ProviderView] = {}
    hv_records: dict[str, ResourceProvider] = {}
    named: dict[str, str] = {}
    for host_name in names:
        try:
            named[provider_uuid(store.get_hypervisor(host_name))] = host_name
        except NotFound:
            continue
    for u in dict.fromkeys([*uuids, *named]):
        try:
            got = store.get("ResourceProvider", u)
        except NotFound:
            got = None
        except Exception:  # not a name the store takes: no record
            got = None
        rec = got if isinstance(got, ResourceProvider) else None
        if rec is not None and rec.spec.hypervisor is None:
            providers[u] = record_view(rec)
            continue
        name = rec.spec.hypervisor if rec is not None else named.get(u) or hosts.get(u)
        if name is None:
            continue
        try:
            h = store.get_hypervisor(name)
        except NotFound:
            continue
        if provider_uuid(h) != u:
            continue
        if policies is None:
            policies = store.list_overcommit_policies()
        if rec is not None:
            hv_records[u] = rec
        mine = [r for r in reservations if r.spec.hypervisor == name]
        providers[u] = hypervisor_view(h, mine, policies, rec, now)
    return Fleet(providers, hv_records, now)


def custom_names(store: Store, of: str) -> dict[str, PlacementName]:
    return {n.spec.placement_name: n for n in store.list("PlacementName").items
            if isinstance(n, PlacementName) and n.spec.of == of}


def resource_classes(store: Store) -> dict[str, PlacementName | None]:
    """Every resource class: the standard ones (None) and the custom ones (their record)."""
    out: dict[str, PlacementName | None] = dict.fromkeys(RESOURCE_CLASSES)
    out.update(custom_names(store, "resource-class"))
    return out


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


def allocations_of(fleet: Fleet, consumer_uuid: str) -> dict[str, dict[str, int]]:
    """provider uuid -> resource class -> amount, for one consumer."""
    return {p.uuid: dict(p.allocations[consumer_uuid]) for p in fleet.providers.values()
            if consumer_uuid in p.allocations}


def tree_of(fleet: Fleet, uuid: str) -> list[ProviderView]:
    root = fleet.provider(uuid).root_uuid
    return [p for p in fleet.providers.values() if p.root_uuid == root]


def descendants(fleet: Fleet, uuid: str) -> set[str]:
    children: dict[str, list[str]] = {}
    for p in fleet.providers.values():
        if p.parent_uuid:
            children.setdefault(p.parent_uuid, []).append(p.uuid)
    out: set[str] = set()
    todo = [uuid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def latest(times: Mapping[str, datetime | None] | list[datetime | None], default: datetime) -> datetime:
    values = [t for t in (times.values() if isinstance(times, Mapping) else times) if t is not None]
    return max(values) if values else default
