"""Placement's operations on providers, inventories, traits, aggregates,
resource classes and usages, over the store (hvfleet.placement.records).

Thin handlers (hvfleet.server.placement) parse and validate the request, call
one function here and render its answer per microversion. Every write names
the generation it read: the record's compare-and-swap in the store refuses a
stale one with Placement's 409 (placement.concurrent_update).

A hypervisor's inventories are computed from its status and spec, never
stored: a client's PUT of an inventory of a hypervisor provider is accepted
only when it equals what hvfleet computes (a no-op, generation unchanged),
and refused with a 409 otherwise (see docs/placement.md)."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from hvfleet.model.bounds import MAX_LIST
from hvfleet.model.errors import AlreadyExists, Conflict, InvalidInput, NotFound
from hvfleet.model.meta import API_VERSION, ObjectMeta, OwnerReference
from hvfleet.model.placement import (
    PlacementInventory,
    PlacementName,
    PlacementNameSpec,
    ResourceProvider,
    ResourceProviderSpec,
)
from hvfleet.placement import records
from hvfleet.placement.errors import (
    CONCURRENT_UPDATE,
    DUPLICATE_NAME,
    INVENTORY_INUSE,
    PROVIDER_CANNOT_DELETE_PARENT,
    PROVIDER_IN_USE,
    PlacementBadRequest,
    PlacementConflict,
    PlacementNotFound,
)
from hvfleet.placement.graph import Inventory
from hvfleet.placement.query import MemberOf, Traits
from hvfleet.placement.records import Fleet, ProviderView, Source, name_key, now_text
from hvfleet.placement.standard_names import RESOURCE_CLASSES, TRAITS
from hvfleet.store.base import Store, Write

MANAGER = "hvfleet-placement"
INVENTORY_DEFAULTS: dict[str, Any] = {"reserved": 0, "min_unit": 1, "max_unit": 2147483647,
                                      "step_size": 1, "allocation_ratio": 1.0}


def _save(store: Store, writes: Sequence[Write], what: str) -> None:
    try:
        store.write_all(list(writes), MANAGER)
    except (Conflict, AlreadyExists, NotFound) as exc:
        raise PlacementConflict(f"{what}: {exc}", code=CONCURRENT_UPDATE) from None
    except InvalidInput as exc:  # past a bound of the stored record
        raise PlacementBadRequest(f"Unable to save {what}: {exc}") from None


def _at_most(names: Sequence[str], what: str, uuid: str) -> None:
    """A provider's record holds at most MAX_LIST traits, and as many aggregates."""
    if len(names) > MAX_LIST:
        raise PlacementBadRequest(f"Unable to save resource provider {uuid}: a resource provider has "
                                  f"at most {MAX_LIST} {what}, not {len(names)}")


def tree_owner(fleet: Fleet, root: str) -> list[OwnerReference] | None:
    """The owners of a record in the tree whose root is `root`: that tree's
    Hypervisor, when the root is one, so that the collector deletes the
    tree's records with it (until then no answer shows them:
    records.cut_off); none for a tree of stored providers."""
    p = fleet.providers.get(root)
    h = p.hypervisor if p is not None else None
    if h is None or not h.metadata.uid:
        return None
    return [OwnerReference(api_version=API_VERSION, kind=h.kind, name=h.name, uid=h.metadata.uid)]


def _owned(rec: ResourceProvider, owners: list[OwnerReference] | None) -> ResourceProvider:
    if rec.metadata.owner_references == owners:
        return rec
    return rec.model_copy(update={"metadata": rec.metadata.model_copy(update={"owner_references": owners})})


def _record_for(fleet: Fleet, p: ProviderView) -> tuple[ResourceProvider, bool]:
    """The record to write for provider `p` (a hypervisor's is created on first
    write) and whether it exists yet."""
    if p.record is not None:
        return p.record, True
    assert p.hypervisor is not None
    now = now_text()
    return ResourceProvider(
        metadata=ObjectMeta(name=p.uuid),
        spec=ResourceProviderSpec(provider_name=p.name, root_uuid=p.uuid, hypervisor=p.hypervisor.name,
                                  created_at=now, updated_at=now),
    ), False


def write_provider(fleet: Fleet, p: ProviderView, *, bump: bool = True,
                   **changes: Any) -> Write:
    """The write of `p`'s record with `changes`, its generation moved on unless
    not `bump` (Placement leaves it on a rename and where allocations only
    went away), owned by its tree's Hypervisor (`tree_owner`; a record
    written before records had owners gets its owner here). The write is
    compare-and-swap on the record either way."""
    rec, exists = _record_for(fleet, p)
    generation = p.generation + 1 if bump else p.generation
    spec = rec.spec.model_copy(update={**changes, "generation": generation,
                                       "updated_at": now_text()})
    new = _owned(rec.model_copy(update={"spec": spec}), tree_owner(fleet, spec.root_uuid or p.uuid))
    return Write("update" if exists else "create", new)


def check_generation(p: ProviderView, generation: int, message: str) -> None:
    if generation != p.generation:
        raise PlacementConflict(message, code=CONCURRENT_UPDATE)


# -- providers --------------------------------------------------------------------------


def _valid_uuid(value: str) -> str:
    return str(uuidlib.UUID(value))


def create_provider(src: Source, name: str, uuid: str | None, parent: str | None) -> ProviderView:
    fleet = src.fleet()
    uid = _valid_uuid(uuid) if uuid else str(uuidlib.uuid4())
    dup = []
    if uid in fleet.providers:
        dup.append(f"uuid: {uid}")
    if fleet.named(name) is not None:
        dup.append(f"name: {name}")
    if dup:
        detail = f"Conflicting resource provider {', '.join(dup)} already exists."
        same_name = fleet.named(name)
        if same_name is not None and same_name.hypervisor is not None and same_name.uuid != uid:
            # nova-compute registering its node under its own uuid: say which
            # provider the node already is (docs/placement.md, nova-compute).
            detail += (f" It is hvfleet's Hypervisor {same_name.hypervisor.name}, resource provider "
                       f"{same_name.uuid}, whose inventories hvfleet computes: give the compute "
                       f"service that uuid as its compute node uuid.")
        raise PlacementConflict(detail, code=DUPLICATE_NAME)
    root = uid
    if parent is not None:
        parent = _valid_uuid(parent)
        if parent == uid:
            raise PlacementBadRequest(
                f'Unable to create resource provider "{name}", {uid}: Object action create failed '
                "because: parent provider UUID cannot be same as UUID. Please set parent provider "
                "UUID to None if there is no parent.")
        if parent not in fleet.providers:
            raise PlacementBadRequest(
                f'Unable to create resource provider "{name}", {uid}: Object action create failed '
                "because: parent provider UUID does not exist.")
        root = fleet.providers[parent].root_uuid
    now = now_text()
    rec = ResourceProvider(metadata=ObjectMeta(name=uid, owner_references=tree_owner(fleet, root)),
                           spec=ResourceProviderSpec(provider_name=name, parent_uuid=parent, root_uuid=root,
                                                     created_at=now, updated_at=now))
    try:
        src.store.create(rec, MANAGER)
    except AlreadyExists:
        raise PlacementConflict(f"Conflicting resource provider uuid: {uid} already exists.",
                                code=DUPLICATE_NAME) from None
    return records.record_view(rec)


def update_provider(
    src: Source, uuid: str, data: Mapping[str, Any], allow_reparenting: bool
) -> ProviderView:
    fleet = src.fleet()
    p = fleet.provider(uuid)
    name = data.get("name", p.name)

    def name_free() -> None:
        # After the parent's checks, as Placement meets a taken name only when
        # it writes (its unique constraint), after refusing a loop or a move.
        if name != p.name and fleet.named(name) is not None:
            raise PlacementConflict(f"Conflicting resource provider {name} already exists.",
                                    code=DUPLICATE_NAME)

    changes: dict[str, Any] = {"provider_name": name}
    if p.hypervisor is not None and name != p.name:
        raise PlacementBadRequest(
            f"Unable to save resource provider {uuid}: the name of a hypervisor provider is its "
            "Hypervisor's name (rename the Hypervisor in hvfleet)")
    if "parent_provider_uuid" in data:
        parent = data["parent_provider_uuid"]
        parent = _valid_uuid(parent) if parent else None
        if parent != p.parent_uuid:
            if p.hypervisor is not None:
                raise PlacementBadRequest(f"Unable to save resource provider {uuid}: a hypervisor "
                                          "provider is a root provider")
            if parent is not None and parent not in fleet.providers:
                raise PlacementBadRequest(f"Unable to save resource provider {uuid}: Object action "
                                          "update failed because: parent provider UUID does not exist.")
            if not allow_reparenting:
                what = "un-parenting" if parent is None else "re-parenting"
                if p.parent_uuid is not None:
                    raise PlacementBadRequest(
                        f"Unable to save resource provider {uuid}: Object action update failed "
                        f"because: {what} a provider is not currently allowed.")
            if parent is not None and (parent == uuid or parent in fleet.descendants(uuid)):
                raise PlacementBadRequest(
                    f"Unable to save resource provider {uuid}: Object action update failed "
                    "because: creating loop in the provider tree is not allowed.")
            name_free()
            root = fleet.providers[parent].root_uuid if parent else uuid
            changes["parent_uuid"] = parent
            changes["root_uuid"] = root
            writes = [write_provider(fleet, p, bump=False, **changes)]
            owners = tree_owner(fleet, root)
            for d in fleet.descendants(uuid):
                dp = fleet.providers[d]
                if dp.record is not None:
                    writes.append(Write("update", _owned(dp.record.model_copy(update={
                        "spec": dp.record.spec.model_copy(update={"root_uuid": root})}), owners)))
            _save(src.store, writes, f"resource provider {uuid}")
            return src.fleet().provider(uuid)
    if name == p.name:
        return p
    name_free()
    _save(src.store, [write_provider(fleet, p, bump=False, **changes)], f"resource provider {uuid}")
    return src.fleet().provider(uuid)


def delete_provider(src: Source, uuid: str) -> None:
    fleet = src.fleet()
    p = fleet.providers.get(uuid)
    if p is None:
        raise PlacementNotFound(f"No resource provider with uuid {uuid} found for delete")
    if p.hypervisor is not None:
        raise PlacementConflict(
            f"Unable to delete resource provider {uuid}: it is Hypervisor {p.hypervisor.name} "
            "(delete the Hypervisor in hvfleet)", code=PROVIDER_IN_USE)
    if fleet.children(uuid):
        raise PlacementConflict(
            f"Unable to delete parent resource provider {uuid}: It has child resource providers.",
            code=PROVIDER_CANNOT_DELETE_PARENT)
    if p.allocations:
        raise PlacementConflict(
            f"Unable to delete resource provider {uuid}: Resource provider has allocations.",
            code=PROVIDER_IN_USE)
    assert p.record is not None
    try:
        src.store.delete("ResourceProvider", uuid, p.record.metadata.resource_version)
    except NotFound:
        raise PlacementNotFound(f"No resource provider with uuid {uuid} found for delete") from None
    except Conflict:
        raise PlacementConflict(f"Unable to delete resource provider {uuid}: changed meanwhile",
                                code=CONCURRENT_UPDATE) from None


def list_providers(
    src: Source,
    *,
    name: str | None = None,
    uuid: str | None = None,
    in_tree: str | None = None,
    member_of: MemberOf = MemberOf((), frozenset()),
    resources: Mapping[str, int] | None = None,
    traits: Traits = Traits((), frozenset()),
) -> list[ProviderView]:
    fleet = src.fleet()
    known, known_traits = src.known_names()
    if resources:
        for rc in resources:
            if rc not in known:
                raise PlacementBadRequest(
                    f"Invalid resource class in resources parameter: No such resource class {rc}.")
    wanted_traits = set(traits.forbidden) | {t for group in traits.required for t in group}
    if wanted_traits:
        missing = sorted(t for t in wanted_traits if t not in known_traits)
        if missing:
            raise PlacementBadRequest(
                f'Invalid trait(s) in "required" parameter: No such trait(s): {", ".join(missing)}.')
    tree_root = None
    if in_tree is not None:
        t = fleet.providers.get(in_tree)
        if t is None:
            return []
        tree_root = t.root_uuid
    # Narrowed by a lookup where the query names a provider or a tree (what
    # nova-compute asks), else every provider is looked at.
    pool: Iterable[ProviderView] = fleet.providers.values()
    if uuid is not None:
        pool = [fleet.providers[uuid]] if uuid in fleet.providers else []
    elif name is not None:
        pool = fleet.all_named(name)
    elif tree_root is not None:
        pool = [fleet.providers[u] for u in fleet.tree(tree_root) if u in fleet.providers]
    out = []
    for p in pool:
        if name is not None and p.name != name:
            continue
        if uuid is not None and p.uuid != uuid:
            continue
        if tree_root is not None and p.root_uuid != tree_root:
            continue
        if any(not group.intersection(p.aggregates) for group in member_of.required):
            continue
        if member_of.forbidden.intersection(p.aggregates):
            continue
        if any(not (group & p.traits) for group in traits.required) or traits.forbidden & p.traits:
            continue
        if resources and not _has_room(p, resources):
            continue
        out.append(p)
    return sorted(out, key=lambda p: p.uuid)


def _has_room(p: ProviderView, resources: Mapping[str, int]) -> bool:
    usages = p.usages
    for rc, amount in resources.items():
        inv = p.inventories.get(rc)
        if inv is None:
            return False
        if usages.get(rc, 0) + amount > inv.capacity or amount > inv.max_unit or amount < inv.min_unit:
            return False
        if amount % inv.step_size:
            return False
    return True


# -- inventories ------------------------------------------------------------------------


def _check_capacity(p: ProviderView, rc: str, inv: Mapping[str, Any], reserved_can_be_total: bool,
                    verb: str = "update") -> None:
    # Placement judges the capacity, int((total - reserved) * allocation_ratio),
    # not reserved against total: a reserve past the total at a ratio below 1
    # rounds to a capacity of 0, which 1.26 and later take.
    capacity = int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
    bad = capacity < 0 if reserved_can_be_total else capacity <= 0
    if bad:
        word = "greater than" if reserved_can_be_total else "greater than or equal to"
        raise PlacementBadRequest(
            f"Unable to {verb} inventory for resource provider {p.uuid}: Invalid inventory for "
            f"'{rc}' on resource provider '{p.uuid}'. The reserved value is {word} total.")
    if inv["min_unit"] > inv["max_unit"]:
        raise PlacementBadRequest(
            f"Unable to {verb} inventory for resource provider {p.uuid}: Invalid inventory for "
            f"'{rc}' on resource provider '{p.uuid}'. The min_unit value is greater than max_unit.")


def _in_use(p: ProviderView, new: Mapping[str, Mapping[str, Any]]) -> None:
    """Placement refuses removing an inventory that has allocations; it
    allows shrinking capacity below usage (a warning in its log, not an error)."""
    usages = p.usages
    gone = sorted(rc for rc in p.inventories if rc not in new and usages.get(rc, 0) > 0)
    if gone:
        raise PlacementConflict(
            f"update conflict: Inventory for '{', '.join(gone)}' on resource provider "
            f"'{p.uuid}' in use.", code=INVENTORY_INUSE)


def _as_inventory(inv: Mapping[str, Any]) -> PlacementInventory:
    return PlacementInventory(**{k: v for k, v in inv.items() if k != "resource_provider_generation"})


def _known_classes(src: Source, classes: Sequence[str], p: ProviderView) -> None:
    known, _ = src.known_names()
    for rc in classes:
        if rc not in known:
            raise PlacementBadRequest(
                f"Unknown resource class in inventory for resource provider {p.uuid}: "
                f"No such resource class {rc}.")


def _hypervisor_inventory(p: ProviderView, new: Mapping[str, Mapping[str, Any]]) -> None:
    """THE rule for a hypervisor: its inventories are computed; a PUT that
    agrees is a no-op, any other is refused."""
    computed = {rc: _inv_dict(i) for rc, i in p.inventories.items()}
    given = {rc: {**INVENTORY_DEFAULTS, **{k: v for k, v in i.items() if k != "resource_provider_generation"}}
             for rc, i in new.items()}
    for inv in given.values():
        inv["allocation_ratio"] = float(inv["allocation_ratio"])
    if given != computed:
        raise PlacementConflict(
            f"Unable to update inventory for resource provider {p.uuid}: it is Hypervisor "
            f"{p.name if p.hypervisor is None else p.hypervisor.name}, whose inventories hvfleet "
            "computes from its status and spec (set spec.overcommit, spec.reserved or "
            "spec.extraCapacity in hvfleet instead)", code=CONCURRENT_UPDATE)


def _inv_dict(i: Inventory) -> dict[str, Any]:
    return {"total": i.total, "reserved": i.reserved, "min_unit": i.min_unit, "max_unit": i.max_unit,
            "step_size": i.step_size, "allocation_ratio": float(i.allocation_ratio)}


def set_inventories(src: Source, uuid: str, generation: int,
                    inventories: Mapping[str, Mapping[str, Any]],
                    reserved_can_be_total: bool) -> ProviderView:
    fleet = src.fleet()
    p = fleet.provider(uuid)
    check_generation(p, generation, "resource provider generation conflict")
    new = {rc: {**INVENTORY_DEFAULTS, **inv} for rc, inv in inventories.items()}
    _known_classes(src, list(new), p)
    for rc, inv in new.items():
        _check_capacity(p, rc, inv, reserved_can_be_total)
    if p.hypervisor is not None:
        _hypervisor_inventory(p, inventories)
        return p
    _in_use(p, new)
    stored = {rc: _as_inventory(i) for rc, i in new.items()}
    _save(src.store, [write_provider(fleet, p, inventories=stored)],
          f"resource provider {uuid}")
    return src.fleet().provider(uuid)


def set_inventory(src: Source, uuid: str, rc: str, data: Mapping[str, Any],
                  reserved_can_be_total: bool, create: bool) -> ProviderView:
    """PUT /inventories/{rc} (`create` False: the class must have an
    inventory) or POST /inventories (`create`: it must not)."""
    fleet = src.fleet()
    p = fleet.provider(uuid)
    if create and rc in p.inventories:
        raise PlacementConflict(
            f"Update conflict: Inventory for '{rc}' on resource provider '{uuid}' invalid.")
    if not create:
        check_generation(p, data["resource_provider_generation"], "resource provider generation conflict")
    inv = {**INVENTORY_DEFAULTS, **{k: v for k, v in data.items()
                                   if k not in ("resource_provider_generation", "resource_class")}}
    _known_classes(src, [rc], p)
    _check_capacity(p, rc, inv, reserved_can_be_total, "create" if create else "update")
    if not create and rc not in p.inventories:
        raise PlacementBadRequest(
            f"No inventory record with resource class for resource provider {uuid}: "
            f"No inventory of class {rc} found.")
    merged = {k: _inv_dict(i) for k, i in p.inventories.items()}
    merged[rc] = inv
    if p.hypervisor is not None:
        _hypervisor_inventory(p, merged)
        return p
    _save(src.store, [write_provider(fleet, p,
                                 inventories={k: _as_inventory(i) for k, i in merged.items()})],
          f"resource provider {uuid}")
    return src.fleet().provider(uuid)


def delete_inventory(src: Source, uuid: str, rc: str) -> None:
    fleet = src.fleet()
    p = fleet.provider(uuid)
    if rc not in p.inventories:
        raise PlacementNotFound(
            f"No inventory of class {rc} found for delete: No inventory of class {rc} found for delete")
    if p.hypervisor is not None:
        raise PlacementConflict(
            f"Unable to delete inventory for resource provider {uuid}: it is Hypervisor "
            f"{p.hypervisor.name}, whose inventories hvfleet computes", code=CONCURRENT_UPDATE)
    if p.usages.get(rc, 0) > 0:
        raise PlacementConflict(
            f"Inventory for '{rc}' on resource provider '{uuid}' in use.", code=INVENTORY_INUSE)
    rest = {k: _as_inventory(_inv_dict(i)) for k, i in p.inventories.items() if k != rc}
    _save(src.store, [write_provider(fleet, p, inventories=rest)], f"resource provider {uuid}")


def delete_inventories(src: Source, uuid: str) -> None:
    fleet = src.fleet()
    p = fleet.provider(uuid)
    if p.hypervisor is not None:
        raise PlacementConflict(
            f"Unable to delete inventory for resource provider {uuid}: it is Hypervisor "
            f"{p.hypervisor.name}, whose inventories hvfleet computes", code=CONCURRENT_UPDATE)
    _in_use(p, {})
    _save(src.store, [write_provider(fleet, p, inventories={})], f"resource provider {uuid}")


# -- traits -----------------------------------------------------------------------------


def set_provider_traits(src: Source, uuid: str, generation: int, names: Sequence[str]) -> ProviderView:
    fleet = src.fleet()
    p = fleet.provider(uuid)
    check_generation(p, generation, "Resource provider's generation already changed. "
                     "Please update the generation and try again.")
    _, known = src.known_names()
    missing = [t for t in names if t not in known]
    if missing:
        raise PlacementBadRequest(f"No such trait {', '.join(missing)}")
    traits = sorted(set(names))
    _at_most(traits, "traits", uuid)
    stored = p.record.spec.traits if p.record is not None else []
    if traits == sorted(set(stored)):
        return p  # as Placement: the same traits again write nothing, the generation stays
    _save(src.store, [write_provider(fleet, p, traits=traits)], f"resource provider {uuid}")
    return src.fleet().provider(uuid)


def create_custom(store: Store, of: str, name: str) -> bool:
    """Create a custom trait or resource class; False when it already exists."""
    now = now_text()
    try:
        store.create(PlacementName(metadata=ObjectMeta(name=name_key(of, name)),
                                   spec=PlacementNameSpec(of=of, placement_name=name,
                                                          created_at=now, updated_at=now)), MANAGER)
    except AlreadyExists:
        return False
    return True


def delete_trait(src: Source, name: str) -> None:
    store = src.store
    if name in TRAITS:
        raise PlacementBadRequest(f"Cannot delete standard trait {name}.")
    if name not in src.known_names()[1]:
        raise PlacementNotFound(f"No such trait(s): {name}.")
    if any(name in p.traits for p in src.fleet().providers.values()):
        raise PlacementConflict(f"The trait {name} is in use by a resource provider.")
    try:
        store.delete("PlacementName", name_key("trait", name))
    except NotFound:
        raise PlacementNotFound(f"No such trait(s): {name}.") from None


def rename_resource_class(src: Source, name: str, new: str) -> str:
    """PUT /resource_classes/{name} before 1.7: the custom class's new name."""
    store = src.store
    known, _ = src.known_names()
    if name not in known or name in RESOURCE_CLASSES:
        raise PlacementNotFound(f"No such resource class {name}.")
    if new in known:
        raise PlacementConflict(f"Resource class already exists: {new}")
    if any(name in p.inventories for p in src.fleet().providers.values()):
        raise PlacementConflict(f"Resource class {name} is in use in inventory: not renamed")
    create_custom(store, "resource-class", new)
    store.delete("PlacementName", name_key("resource-class", name))
    return new


def delete_resource_class(src: Source, name: str) -> None:
    store = src.store
    if name in RESOURCE_CLASSES:
        raise PlacementBadRequest(
            f"Error in delete resource class: Cannot delete standard resource class {name}.")
    if name not in src.known_names()[0]:
        raise PlacementNotFound(f"No such resource class {name}.")
    if any(name in p.inventories for p in src.fleet().providers.values()):
        raise PlacementConflict(
            f"Error in delete resource class: Cannot delete resource class {name}. "
            "Class is in use in inventory.")
    store.delete("PlacementName", name_key("resource-class", name))


# -- aggregates -------------------------------------------------------------------------


def set_aggregates(
    src: Source, uuid: str, generation: int | None, aggregates: Sequence[str]
) -> ProviderView:
    fleet = src.fleet()
    p = fleet.provider(uuid)
    if generation is not None:
        check_generation(p, generation, "Resource provider's generation already changed. "
                         "Please update the generation and try again.")
    distinct = list(dict.fromkeys(aggregates))
    _at_most(distinct, "aggregates", uuid)
    _save(src.store, [write_provider(fleet, p, aggregates=distinct)], f"resource provider {uuid}")
    return src.fleet().provider(uuid)


# -- usages -----------------------------------------------------------------------------


def provider_usages(src: Source, uuid: str) -> ProviderView:
    fleet = src.fleet()
    p = fleet.providers.get(uuid)
    if p is None:
        raise PlacementNotFound(
            f"No resource provider with uuid {uuid} found: No resource provider with uuid {uuid} found")
    return p


def total_usages(src: Source, project_id: str, user_id: str | None,
                 consumer_type: str | None) -> dict[str, tuple[int, dict[str, int]]]:
    """consumer_type -> (how many consumers, resource class -> used), for the
    consumers of a project (and user). hvfleet's own claims (no Placement
    consumer record) belong to no project, so no query counts them."""
    fleet = src.fleet()
    out: dict[str, dict[str, int]] = {}
    seen: dict[str, set[str]] = {}
    for c in src.project_consumers(project_id):
        if user_id is not None and c.spec.user_id != user_id:
            continue
        ctype = c.spec.consumer_type or "unknown"
        if consumer_type not in (None, "all") and ctype != consumer_type:
            continue
        for resources in fleet.allocations_of(c.name).values():
            mine = out.setdefault(ctype, {})
            seen.setdefault(ctype, set()).add(c.name)
            for rc, n in resources.items():
                mine[rc] = mine.get(rc, 0) + n
    return {t: (len(seen[t]), res) for t, res in out.items()}


def last_modified(items: Sequence[datetime | None], default: datetime) -> datetime:
    return records.latest(list(items), default)


def valid_input(exc: InvalidInput) -> PlacementBadRequest:
    return PlacementBadRequest(str(exc))
