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
import threading
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from hvfleet.model.capacity import beyond_libvirt, instance_of
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
    PlacementError,
    PlacementNotFound,
)
from hvfleet.placement.graph import Inventory
from hvfleet.placement.records import Fleet, ProviderView, Source, now_text, units_of
from hvfleet.placement.service import INVENTORY_DEFAULTS, MANAGER, check_generation, write_provider
from hvfleet.scheduling.claims import claim_write, reservation_labels
from hvfleet.scheduling.errors import ConsumerAlreadyHolds, DoesNotFit
from hvfleet.scheduling.placement import resource_for_class
from hvfleet.store.base import Store, Write

INCOMPLETE = "00000000-0000-0000-0000-000000000000"
# The generation of a consumer whose allocations are hvfleet's own claims
# (`hvfleet reserve`, the API's claim) and that has no Placement record: in
# Placement (1.28 on) a consumer with allocations always has one, and a write
# that names it new (`null`) is refused. 0 is a consumer created and never
# moved on by a Placement write; the first such write (naming 0) creates its
# record at 1, compare-and-swapped by the store (a second writer naming 0
# finds the record made: 409), and replaces its claims in the same write.
CLAIMS_ONLY_GENERATION = 0


def consumer_generation(rec: PlacementConsumer | None, has_allocations: bool) -> int | None:
    """The generation Placement's clients see of a consumer: its record's, else
    CLAIMS_ONLY_GENERATION while it has allocations (hvfleet's claims), else
    None (no consumer: a write names it new)."""
    if not has_allocations:
        return None
    return rec.spec.generation if rec is not None else CLAIMS_ONLY_GENERATION


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


def _amounts(resources: Mapping[str, int]) -> dict[ResourceName, Quantity]:
    amounts: dict[ResourceName, Quantity] = {}
    for rc, n in resources.items():
        r = resource_for_class(rc)
        amounts[r] = r.quantity(r.from_placement_units(n))
    return amounts


def holds(p: ProviderView, consumer: str, resources: Mapping[str, int]) -> dict[str, int]:
    """What `consumer`'s allocation of `resources` on `p` adds to its usage: all
    of it, except on a hypervisor where the consumer's instance is listed,
    whose claim holds only what libvirt's allocation (`p.unclaimed`) does not
    count of it (all of it while that allocation leaves the instance out, e.g.
    shut off under `--count running`; `beyond_libvirt`, as `claim_holds`
    judges a claim): Placement's usage − old + new, counting the instance
    once."""
    h = p.hypervisor
    instance = instance_of(consumer, h)
    if h is None or instance is None:
        return dict(resources)
    return {rc: n for rc, n in units_of(beyond_libvirt(_amounts(resources), instance, h)).items() if n}


def _check_amounts(p: ProviderView, consumer: str, working: Mapping[str, Mapping[str, int]],
                   resources: Mapping[str, int]) -> None:
    """`resources` for `consumer` on `p`, whose allocations are `working` (what
    this request has written so far, as they hold: `holds`): Placement's
    capacity and unit checks, the capacity judged on what the allocation adds."""
    usages = dict(p.unclaimed)
    for c, res in working.items():
        if c != consumer:
            for rc, n in res.items():
                usages[rc] = usages.get(rc, 0) + n
    adds = holds(p, consumer, resources)
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
        if usages.get(rc, 0) + adds.get(rc, 0) > inv.capacity:
            raise PlacementConflict(
                f"Unable to allocate inventory: Unable to create allocation for '{rc}' on resource "
                f"provider '{p.uuid}'. The requested amount would exceed the capacity.")


def _reservation(host: str, consumer: str, resources: Mapping[str, int], generation: int) -> Reservation:
    return Reservation(
        metadata=ObjectMeta(name=alloc_name(host, consumer, generation),
                            labels=reservation_labels(host, "hvfleet")),
        spec=ReservationSpec(hypervisor=host, resources=_amounts(resources), consumer=consumer),
        status=ReservationStatus(phase="Active"),
    )


def _reservations_of(src: Source, host: str, consumer: str) -> list[Reservation]:
    return [r for r in src.reservations_of(host) if r.spec.consumer == consumer]


Inventories = Mapping[str, tuple[int, Mapping[str, Mapping[str, Any]]]]


def set_allocations(src: Source, requests: list[ConsumerRequest],
                    inventories: Inventories | None = None) -> None:
    """Replace the allocations of every consumer in `requests` (POST /allocations
    is several; PUT /allocations/{consumer} one), all checked against one read
    (the server's snapshot, caught up with every earlier write: what it has
    is compare-and-swapped or re-checked inside the write, so a stale read is
    refused, never written). With `inventories` (POST /reshaper: provider
    uuid -> (generation, its new inventories)), those providers' inventories
    are replaced in the same write and the allocations are checked against
    them. Where the source has a writer (a server), the request joins the
    writes waiting there (`AllocationWriter`)."""
    if src.writer is not None and not inventories:
        src.writer.write(src, requests)
        return
    plan = _Plan(src.settled(), inventories)
    for req in requests:
        plan.add(req)
    plan.write()


class _Plan:
    """The one atomic write a group of requests becomes: each request is
    checked against the state the ones added before it leave (`add`, all or
    nothing per request group: `mark`/`undo`), then `write` writes them all
    in one `Store.write_all`."""

    def __init__(self, src: Source, inventories: Inventories | None = None) -> None:
        self.src = src
        self.store = src.store
        fleet = src.fleet()
        self.known, _ = src.known_names()
        self.fleet, self.reshaped = _reshape(fleet, inventories or {})
        self.now = now_text()
        # provider -> consumer -> resources, as the requests added leave them
        self.working: dict[str, dict[str, dict[str, int]]] = {}
        self.grown: set[str] = set()  # providers a consumer allocates on
        self.consumer_writes: list[Write] = []
        self.hv_claims: list[tuple[str, str, dict[str, int], int]] = []  # (host, consumer, resources, gen)
        self.hv_drops: list[tuple[str, str]] = []

    def mark(self) -> tuple[Any, ...]:
        return ({rp: dict(a) for rp, a in self.working.items()}, set(self.grown),
                len(self.consumer_writes), len(self.hv_claims), len(self.hv_drops))

    def undo(self, mark: tuple[Any, ...]) -> None:
        working, grown, consumers, claims, drops = mark
        self.working, self.grown = working, grown
        del self.consumer_writes[consumers:], self.hv_claims[claims:], self.hv_drops[drops:]

    def add(self, req: ConsumerRequest) -> None:
        fleet, consumer = self.fleet, req.consumer
        rec = self.src.consumer(consumer)
        before = fleet.allocations_of(consumer)
        # A record whose allocations all went (with a deleted host's tree, or
        # a claim released in hvfleet) is no consumer, as in Placement, which
        # deletes a consumer with its last allocation: it is asked for as a
        # new one (generation null) and its record written over, its
        # generation still moving on (a claim's name carries it). Claims
        # without a record (`hvfleet reserve`) are a consumer of generation 0.
        expected = consumer_generation(rec, bool(before))
        if req.check_generation:
            if expected is not None and expected != req.consumer_generation:
                raise PlacementConflict(
                    f"consumer generation conflict - expected {expected} but got "
                    f"{'None' if req.consumer_generation is None else req.consumer_generation}",
                    code=CONCURRENT_UPDATE)
            if expected is None and req.consumer_generation is not None:
                raise PlacementConflict(
                    f"consumer generation conflict - expected null but got {req.consumer_generation}",
                    code=CONCURRENT_UPDATE)
        for rp, resources in req.allocations.items():
            if rp not in fleet.providers:
                raise PlacementBadRequest(f"Allocation for resource provider '{rp}' that does not exist.")
            for rc in resources:
                if rc not in self.known:
                    raise PlacementBadRequest(
                        f"Unable to allocate inventory for consumer {consumer}: No such resource "
                        f"class {rc}.")
        generation = (rec.spec.generation + 1) if rec else 1
        for rp in sorted(set(before) | set(req.allocations)):
            p = fleet.providers[rp]
            new = req.allocations.get(rp, {})
            allocs = self.working.setdefault(rp, {c: dict(r) for c, r in p.allocations.items()})
            if new:
                _check_amounts(p, consumer, allocs, new)
                self.grown.add(rp)
                # As it holds: what the next request of a group is checked against.
                allocs[consumer] = holds(p, consumer, new)
            else:
                allocs.pop(consumer, None)
            if p.hypervisor is not None and new != before.get(rp, {}):
                self.hv_drops.append((p.hypervisor.name, consumer))
                if new:
                    self.hv_claims.append((p.hypervisor.name, consumer, new, generation))
        spec = PlacementConsumerSpec(
            project_id=req.project_id or INCOMPLETE, user_id=req.user_id or INCOMPLETE,
            consumer_type=req.consumer_type if req.consumer_type is not None else
            (rec.spec.consumer_type if rec else None),
            generation=generation,
            providers=sorted(u for u in req.allocations if fleet.providers[u].hypervisor is None),
            hypervisors=sorted(h.name for u in req.allocations
                               if (h := fleet.providers[u].hypervisor) is not None),
            created_at=rec.spec.created_at if rec else self.now, updated_at=self.now)
        try:
            meta = ObjectMeta(name=consumer.lower()) if rec is None else rec.metadata
        except ValueError:
            raise PlacementBadRequest(f"Malformed consumer_uuid: {consumer}") from None
        if rec is None:
            self.consumer_writes.append(Write("create", PlacementConsumer(metadata=meta, spec=spec)))
        else:
            self.consumer_writes.append(Write("update", rec.model_copy(update={"spec": spec})))

    def write(self) -> None:
        fleet, working = self.fleet, self.working
        writes: dict[str, Write] = {}  # provider uuid -> its record's write
        for rp, new_inv in self.reshaped.items():
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
                writes[rp] = write_provider(fleet, fleet.providers[rp], bump=rp in self.grown,
                                            allocations=allocs)
        deletes: dict[str, Write] = {}
        for host, consumer in self.hv_drops:
            for r in _reservations_of(self.src, host, consumer):
                deletes[r.name] = Write("delete", r)
        claims = [claim_write(self.store, _reservation(host, consumer, resources, generation))
                  for host, consumer, resources, generation in self.hv_claims]
        try:
            # Deletes first: a claim's check then sees the consumer's old claim gone.
            self.store.write_all([*deletes.values(), *claims, *writes.values(), *self.consumer_writes],
                                 MANAGER)
        except (DoesNotFit, ConsumerAlreadyHolds, InvalidInput) as exc:
            raise PlacementConflict(f"Unable to allocate inventory: {exc}") from None
        except (Conflict, AlreadyExists, NotFound) as exc:
            raise PlacementConflict(
                f"Inventory and/or allocations changed while attempting to allocate: {exc}",
                code=CONCURRENT_UPDATE) from None


@dataclass
class _Job:
    """One request's allocation write waiting in an AllocationWriter."""

    requests: list[ConsumerRequest]
    done: bool = False
    error: BaseException | None = None

    @property
    def consumers(self) -> set[str]:
        return {r.consumer.lower() for r in self.requests}


class AllocationWriter:
    """A server's allocation writes, grouped (one per server process, the
    writer of its Sources).

    Requests that write allocations at the same time (eight schedulers on
    one provider) would each read the provider's record and compare-and-swap
    it, and all but one would fail and be retried by their clients: on etcd
    each attempt is several round trips, and most of them are lost. Here
    they queue instead; whoever finds no write under way takes the queue (up
    to MOST requests, each consumer once), catches the snapshot up once,
    checks each request against the state the ones before it leave (a
    request refused is answered with its own refusal, and leaves nothing
    behind) and writes the rest in one `Store.write_all`, each answered when
    it lands. The store's compare-and-swap and claim checks are the same as
    for one request, so the guarantees hold across replicas: a group another
    replica's write got in the way of is written again request by request,
    each with its own answer, as without grouping."""

    MOST = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        self._queue: list[_Job] = []
        self._busy = False
        self.groups = 0  # atomic writes made for more than one request
        self.grouped = 0  # requests written in them

    def write(self, src: Source, requests: list[ConsumerRequest]) -> None:
        job = _Job(requests)
        with self._lock:
            self._queue.append(job)
            while not job.done:
                if self._busy:
                    self._turn.wait()
                    continue
                self._busy = True
                group = self._take()
                self._lock.release()
                try:
                    self._write_group(src, group)
                finally:
                    self._lock.acquire()
                    self._busy = False
                    self._turn.notify_all()
        if job.error is not None:
            raise job.error

    def _take(self) -> list[_Job]:
        """The jobs of the next group, oldest first, each consumer in one of
        them only (its second request must see what the first wrote)."""
        group: list[_Job] = []
        rest: list[_Job] = []
        seen: set[str] = set()
        for job in self._queue:
            mine = job.consumers
            if len(group) < self.MOST and not mine & seen:
                group.append(job)
                seen |= mine
            else:
                rest.append(job)
        self._queue = rest
        return group

    def _write_group(self, src: Source, group: list[_Job]) -> None:
        """Answer every job of `group` (its `error`, or none: written)."""
        try:
            planned = group
            if len(group) > 1:
                plan = _Plan(src.settled())
                planned = []
                for job in group:
                    mark = plan.mark()
                    try:
                        for req in job.requests:
                            plan.add(req)
                    except PlacementError as exc:
                        plan.undo(mark)
                        job.error = exc
                        continue
                    planned.append(job)
                if len(planned) > 1:
                    try:
                        plan.write()
                    except PlacementError:
                        # Another writer came between (another replica), a claim
                        # check refused one of them, or together they are more
                        # than one store transaction takes (InvalidInput): each
                        # on its own, below. (A store that is down fails them all.)
                        pass
                    else:
                        self.groups += 1
                        self.grouped += len(planned)
                        planned = []
            for job in planned:
                try:
                    set_allocations(replace(src, writer=None), job.requests)
                except PlacementError as exc:
                    job.error = exc
        except Exception as exc:  # the store failed: every job not answered gets it
            for job in group:
                if job.error is None:
                    job.error = exc
        finally:
            for job in group:
                job.done = True


def _reshape(fleet: Fleet, inventories: Mapping[str, tuple[int, Mapping[str, Mapping[str, Any]]]]
             ) -> tuple[Fleet, dict[str, dict[str, dict[str, Any]]]]:
    """Check the reshaper's inventories; `fleet` with them in its views (the
    allocations are then checked against them), and them, complete."""
    if not inventories:
        return fleet, {}
    providers: dict[str, ProviderView] = {}  # those whose inventories change
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
    # Over the fleet as it is: its lookups (names, consumers, trees) still hold.
    return replace(fleet, providers=_Reshaped(fleet.providers, providers)), out


class _Reshaped(Mapping[str, ProviderView]):
    """A fleet's providers with some of them seen with their new inventories
    (no copy of the 10,000 others)."""

    def __init__(self, base: Mapping[str, ProviderView], changed: Mapping[str, ProviderView]) -> None:
        self.base, self.changed = base, changed

    def __getitem__(self, uuid: str) -> ProviderView:
        found = self.changed.get(uuid)
        return self.base[uuid] if found is None else found

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)  # the changed ones are among them

    def __len__(self) -> int:
        return len(self.base)


def delete_allocations(src: Source, consumer: str) -> None:
    if not src.fleet().allocations_of(consumer):
        _drop_unheld(src, consumer)
        raise PlacementNotFound(f"No allocations for consumer '{consumer}'")
    set_allocations(src, [ConsumerRequest(consumer, {})])
    _drop_consumer(src.store, consumer)


def drop_empty_consumer(src: Source, consumer: str) -> None:
    """Placement deletes a consumer whose allocations became empty."""
    if not src.fleet().allocations_of(consumer):
        _drop_consumer(src.store, consumer)


def _drop_unheld(src: Source, consumer: str) -> None:
    """The record of a consumer that has no allocation any more (they went
    with their providers: no consumer to Placement), deleted as it was read
    with that fleet: a write to it since (a new allocation) keeps it."""
    settled = src.settled()
    rec = settled.consumer(consumer)
    if rec is not None and not settled.fleet().allocations_of(consumer):
        with contextlib.suppress(Conflict, NotFound):
            settled.store.delete("PlacementConsumer", rec.name, rec.metadata.resource_version)


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
