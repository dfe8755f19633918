"""Placement allocations as hvfleet claims.

An allocation on a hypervisor provider IS a Reservation of that consumer on
that host: written by `Store.claim` with the claim check `hvfleet reserve`
runs (the capacity check inside the store's atomic write), so `hvfleet
reservations`, `capacity`, `fit` and the dashboard count it at once, and an
`hvfleet reserve` shows here as an allocation. An allocation on a stored
provider lives in that provider's record; all the records a consumer's
allocations touch, and the consumer's own record (its generation, project,
user and type), are written in one `Store.write_all`, compare-and-swap on each
record, so two writers racing for the same space cannot both win (Placement's
generation check, done by the store).

A request is one atomic write, whatever it touches: the consumer's old
claims on hypervisors deleted, its new ones made with the claim check inside
the write (Write.check), the provider records and the consumer record
compare-and-swapped, all in one `Store.write_all`; a refusal of any part
writes nothing, so no reader ever sees part of a request."""

from __future__ import annotations

import contextlib
import hashlib
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from hvfleet.model.errors import AlreadyExists, Conflict, InvalidInput, NotFound
from hvfleet.model.hypervisor import Reservation, ReservationSpec, ReservationStatus
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.placement import PlacementConsumer, PlacementConsumerSpec, PlacementInventory
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.placement import records
from hvfleet.placement.errors import (
    CONCURRENT_UPDATE,
    INVENTORY_INUSE,
    PlacementBadRequest,
    PlacementConflict,
    PlacementNotFound,
)
from hvfleet.placement.graph import Inventory
from hvfleet.placement.records import Fleet, ProviderView, Source, now_text, read_fleet
from hvfleet.placement.service import INVENTORY_DEFAULTS, MANAGER, check_generation, write_provider
from hvfleet.scheduling.claims import claim_write, reservation_labels
from hvfleet.scheduling.errors import ConsumerAlreadyHolds, DoesNotFit
from hvfleet.scheduling.placement import resource_for_class
from hvfleet.store.base import Store, Write

INCOMPLETE = "00000000-0000-0000-0000-000000000000"


@dataclass
class ConsumerRequest:
    """What one consumer's allocations become (an empty `allocations`: none)."""

    consumer: str
    allocations: dict[str, dict[str, int]]  # provider uuid -> resource class -> amount
    project_id: str | None = None
    user_id: str | None = None
    # Checked only when `check_generation` (microversion 1.28 and later).
    consumer_generation: int | None = None
    check_generation: bool = False
    consumer_type: str | None = None


@dataclass
class ConsumerAllocations:
    consumer: str
    allocations: dict[str, dict[str, int]]
    generations: dict[str, int]  # provider uuid -> its generation
    record: PlacementConsumer | None


def alloc_name(host: str, consumer: str, generation: int) -> str:
    """A claim's name: one per consumer generation, so a changed allocation's
    new claim and the old one it replaces can be in one atomic write, and two
    writers of one generation of a consumer collide by name."""
    digest = hashlib.sha256(f"{host}\0{consumer}\0{generation}".encode()).hexdigest()[:24]
    return f"alloc-{digest}"


def consumer_allocations(src: Source, consumer: str) -> ConsumerAllocations:
    fleet = src.fleet()
    allocs = fleet.allocations_of(consumer)
    return ConsumerAllocations(consumer, allocs, {u: fleet.providers[u].generation for u in allocs},
                               src.consumer(consumer))


def _check_amounts(p: ProviderView, consumer: str, working: Mapping[str, Mapping[str, int]],
                   resources: Mapping[str, int]) -> None:
    """`resources` for `consumer` on `p`, whose allocations are `working` (what
    this request has written so far): Placement's capacity and unit checks."""
    usages = dict(p.unclaimed)
    for c, res in working.items():
        if c != consumer:
            for rc, n in res.items():
                usages[rc] = usages.get(rc, 0) + n
    for rc, amount in resources.items():
        inv = p.inventories.get(rc)
        if inv is None:
            raise PlacementConflict(
                f"Unable to allocate inventory: Inventory for '{rc}' on resource provider "
                f"'{p.uuid}' invalid.")
        if amount < inv.min_unit or amount > inv.max_unit or amount % inv.step_size:
            raise PlacementConflict(
                f"Unable to allocate inventory: Unable to create allocation for '{rc}' on resource "
                f"provider '{p.uuid}'. The requested amount would violate inventory constraints.")
        if usages.get(rc, 0) + amount > inv.capacity:
            raise PlacementConflict(
                f"Unable to allocate inventory: Unable to create allocation for '{rc}' on resource "
                f"provider '{p.uuid}'. The requested amount would exceed the capacity.")


def _reservation(host: str, consumer: str, resources: Mapping[str, int], generation: int) -> Reservation:
    amounts: dict[ResourceName, Quantity] = {}
    for rc, n in resources.items():
        r = resource_for_class(rc)
        amounts[r] = r.quantity(r.from_placement_units(n))
    return Reservation(
        metadata=ObjectMeta(name=alloc_name(host, consumer, generation),
                            labels=reservation_labels(host, "hvfleet")),
        spec=ReservationSpec(hypervisor=host, resources=amounts, consumer=consumer),
        status=ReservationStatus(phase="Active"),
    )


def _reservations_of(src: Source, host: str, consumer: str) -> list[Reservation]:
    return [r for r in src.reservations_of(host) if r.spec.consumer == consumer]


def set_allocations(src: Source, requests: list[ConsumerRequest],
                    inventories: Mapping[str, tuple[int, Mapping[str, Mapping[str, Any]]]] | None = None,
                    ) -> None:
    """Replace the allocations of every consumer in `requests` (POST /allocations
    is several; PUT /allocations/{consumer} one), all checked against one read
    (the server's snapshot, caught up with every earlier write: what it has
    is compare-and-swapped or re-checked inside the write, so a stale read is
    refused, never written). With `inventories` (POST /reshaper: provider
    uuid -> (generation, its new inventories)), those providers' inventories
    are replaced in the same write and the allocations are checked against
    them."""
    src = src.settled()
    store = src.store
    fleet = read_fleet(store) if inventories else src.fleet()
    known, _ = src.known_names()
    fleet, reshaped = _reshape(fleet, inventories or {})
    now = now_text()
    writes: dict[str, Write] = {}  # provider uuid -> its record's write
    # provider -> consumer -> resources, as this request leaves them
    working: dict[str, dict[str, dict[str, int]]] = {}
    grown: set[str] = set()  # providers a consumer of this request allocates on
    consumer_writes: list[Write] = []
    hv_claims: list[tuple[str, str, dict[str, int], int]] = []  # (host, consumer, resources, generation)
    hv_drops: list[tuple[str, str]] = []
    for req in requests:
        consumer = req.consumer
        rec = records.consumer(store, consumer)
        if req.check_generation:
            if rec is not None and rec.spec.generation != req.consumer_generation:
                raise PlacementConflict(
                    f"consumer generation conflict - expected {rec.spec.generation} but got "
                    f"{'None' if req.consumer_generation is None else req.consumer_generation}",
                    code=CONCURRENT_UPDATE)
            if rec is None and req.consumer_generation is not None:
                raise PlacementConflict(
                    f"consumer generation conflict - expected null but got {req.consumer_generation}",
                    code=CONCURRENT_UPDATE)
        for rp, resources in req.allocations.items():
            if rp not in fleet.providers:
                raise PlacementBadRequest(f"Allocation for resource provider '{rp}' that does not exist.")
            for rc in resources:
                if rc not in known:
                    raise PlacementBadRequest(
                        f"Unable to allocate inventory for consumer {consumer}: No such resource "
                        f"class {rc}.")
        before = fleet.allocations_of(consumer)
        generation = (rec.spec.generation + 1) if rec else 1
        for rp in sorted(set(before) | set(req.allocations)):
            p = fleet.providers[rp]
            new = req.allocations.get(rp, {})
            allocs = working.setdefault(rp, {c: dict(r) for c, r in p.allocations.items()})
            if new:
                _check_amounts(p, consumer, allocs, new)
                grown.add(rp)
                allocs[consumer] = dict(new)
            else:
                allocs.pop(consumer, None)
            if p.hypervisor is not None and new != before.get(rp, {}):
                hv_drops.append((p.hypervisor.name, consumer))
                if new:
                    hv_claims.append((p.hypervisor.name, consumer, new, generation))
        spec = PlacementConsumerSpec(
            project_id=req.project_id or INCOMPLETE, user_id=req.user_id or INCOMPLETE,
            consumer_type=req.consumer_type if req.consumer_type is not None else
            (rec.spec.consumer_type if rec else None),
            generation=generation,
            providers=sorted(u for u in req.allocations if fleet.providers[u].hypervisor is None),
            hypervisors=sorted(h.name for u in req.allocations
                               if (h := fleet.providers[u].hypervisor) is not None),
            created_at=rec.spec.created_at if rec else now, updated_at=now)
        try:
            meta = ObjectMeta(name=consumer.lower()) if rec is None else rec.metadata
        except ValueError:
            raise PlacementBadRequest(f"Malformed consumer_uuid: {consumer}") from None
        if rec is None:
            consumer_writes.append(Write("create", PlacementConsumer(metadata=meta, spec=spec)))
        else:
            consumer_writes.append(Write("update", rec.model_copy(update={"spec": spec})))
    for rp, new_inv in reshaped.items():
        p = fleet.providers[rp]
        allocs = working.get(rp, p.allocations)
        used: dict[str, int] = {}
        for res in allocs.values():
            for rc, n in res.items():
                used[rc] = used.get(rc, 0) + n
        gone = sorted(rc for rc, n in used.items() if n and rc not in new_inv)
        if gone:
            raise PlacementConflict(
                f"Unable to reshape: Inventory for '{', '.join(gone)}' on resource provider "
                f"'{rp}' in use.", code=INVENTORY_INUSE)
        if p.hypervisor is None:
            writes[rp] = write_provider(fleet, p, allocations=allocs, inventories={
                rc: PlacementInventory(**inv) for rc, inv in new_inv.items()})
    for rp, allocs in working.items():
        if fleet.providers[rp].hypervisor is None and rp not in writes:
            # Placement moves a provider's generation on only where allocations were written.
            writes[rp] = write_provider(fleet, fleet.providers[rp], bump=rp in grown,
                                        allocations=allocs)
    deletes: dict[str, Write] = {}
    for host, consumer in hv_drops:
        for r in _reservations_of(src, host, consumer):
            deletes[r.name] = Write("delete", r)
    claims = [claim_write(store, _reservation(host, consumer, resources, generation))
              for host, consumer, resources, generation in hv_claims]
    try:
        # Deletes first: a claim's check then sees the consumer's old claim gone.
        store.write_all([*deletes.values(), *claims, *writes.values(), *consumer_writes], MANAGER)
    except (DoesNotFit, ConsumerAlreadyHolds, InvalidInput) as exc:
        raise PlacementConflict(f"Unable to allocate inventory: {exc}") from None
    except (Conflict, AlreadyExists, NotFound) as exc:
        raise PlacementConflict(
            f"Inventory and/or allocations changed while attempting to allocate: {exc}",
            code=CONCURRENT_UPDATE) from None


def _reshape(fleet: Fleet, inventories: Mapping[str, tuple[int, Mapping[str, Mapping[str, Any]]]]
             ) -> tuple[Fleet, dict[str, dict[str, dict[str, Any]]]]:
    """Check the reshaper's inventories; `fleet` with them in its views (the
    allocations are then checked against them), and them, complete."""
    if not inventories:
        return fleet, {}
    providers = dict(fleet.providers)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for rp, (generation, invs) in inventories.items():
        p = fleet.providers.get(rp)
        if p is None:
            raise PlacementBadRequest(f"Resource provider {rp} in inventories not found")
        check_generation(p, generation, f"resource provider generation conflict for provider {rp}")
        full = {rc: {**INVENTORY_DEFAULTS, **{k: v for k, v in inv.items()
                                              if k != "resource_provider_generation"}}
                for rc, inv in invs.items()}
        for inv in full.values():
            inv["allocation_ratio"] = float(inv["allocation_ratio"])
        if p.hypervisor is not None:
            computed = {rc: {"total": i.total, "reserved": i.reserved, "min_unit": i.min_unit,
                             "max_unit": i.max_unit, "step_size": i.step_size,
                             "allocation_ratio": float(i.allocation_ratio)}
                        for rc, i in p.inventories.items()}
            if full != computed:
                raise PlacementConflict(
                    f"Unable to reshape: resource provider {rp} is Hypervisor {p.hypervisor.name}, "
                    "whose inventories hvfleet computes", code=CONCURRENT_UPDATE)
            continue
        providers[rp] = replace(p, inventories={rc: Inventory(**inv) for rc, inv in full.items()})
        out[rp] = full
    return Fleet(providers, fleet.now), out


def delete_allocations(src: Source, consumer: str) -> None:
    if not src.fleet().allocations_of(consumer):
        raise PlacementNotFound(f"No allocations for consumer '{consumer}'")
    set_allocations(src, [ConsumerRequest(consumer, {})])
    _drop_consumer(src.store, consumer)


def drop_empty_consumer(src: Source, consumer: str) -> None:
    """Placement deletes a consumer whose allocations became empty."""
    if not src.fleet().allocations_of(consumer):
        _drop_consumer(src.store, consumer)


def _drop_consumer(store: Store, consumer: str) -> None:
    rec = records.consumer(store, consumer)
    if rec is not None:
        with contextlib.suppress(Conflict, NotFound):
            store.delete("PlacementConsumer", rec.name, rec.metadata.resource_version)


def normalize_consumer(value: str) -> str:
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        raise PlacementBadRequest(f"Malformed consumer_uuid: {value}") from None


def provider_allocations(fleet: Fleet, uuid: str) -> dict[str, dict[str, int]]:
    p = fleet.providers.get(uuid)
    if p is None:
        raise PlacementNotFound(
            f"Resource provider '{uuid}' not found: No resource provider with uuid {uuid} found")
    return p.consumers


def time_of(rec: Any) -> datetime:
    return records.parse_time(getattr(getattr(rec, "spec", None), "updated_at", None)) or datetime.now(UTC)
