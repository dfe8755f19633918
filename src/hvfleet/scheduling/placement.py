"""The Placement-compatible view of the fleet, and mirroring Placement's promises.

`export_provider` turns a Hypervisor into what OpenStack Placement calls a
resource provider: per resource class an inventory (`total`, `reserved`,
`min_unit`, `max_unit`, `step_size`, `allocation_ratio`) and its usage, such
that Placement's capacity check `used + amount <= (total − reserved) ×
allocation_ratio`, `min_unit <= amount <= max_unit`, `amount % step_size == 0`
accepts exactly what `hvfleet fit` accepts (tested against a real Placement).
Amounts are converted to Placement's units (MEMORY_MB in MiB, DISK_GB in GiB):
capacity is rounded down and reserve and usage up, so Placement never sees
room the host does not have. A resource Placement can never have as a class
(`FOO`, stored before the write-time check: hvfleet.model.resources
.placement_class_error) is left out of every Placement view (inventories,
usages, allocations), and `export` says so per host (`omitted`).

`sync` reads a real Placement's providers and allocations and keeps one
Reservation (source `placement`) per Placement consumer per host, so space
Placement has promised counts in hvfleet until libvirt shows the instance, and
its VGPUs, VFs and other resources the agent does not discover count for as
long as the instance runs. It first pushes hvfleet's inventories (and, when
asked, its claims) the other way (`hvfleet.scheduling.placement_push`), and
never mirrors back a consumer hvfleet itself claims or pushed.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

from hvfleet.model.capacity import (
    add,
    claim_holds,
    held_resources,
    holds_space,
    overcommit_ratios,
    reservation_phase,
    usable_capacity,
)
from hvfleet.model.errors import AlreadyExists, Conflict, InvalidInput, NotFound
from hvfleet.model.hypervisor import (
    HOLDING_PHASES,
    Hypervisor,
    OvercommitPolicy,
    Reservation,
    ReservationSpec,
    ReservationStatus,
    ResourceList,
)
from hvfleet.model.lease import Lease
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.quantity import Quantity
from hvfleet.model.readiness import DEFAULT_STALENESS, host_readiness
from hvfleet.model.resources import ResourceName, resource_of_class
from hvfleet.model.selectors import Selector
from hvfleet.model.units import UnitConstraint, unit_constraints
from hvfleet.scheduling.claims import MANAGER, reservation_labels
from hvfleet.scheduling.fit import reservations_by_host
from hvfleet.scheduling.placement_client import PlacementClient
from hvfleet.scheduling.placement_push import Changes, PushIdentity, push
from hvfleet.scheduling.request import Request
from hvfleet.store.base import Store

# Provider UUIDs for hosts the store has not given a uid: stable per name.
_PROVIDER_NS = uuid.UUID("5b1e4a52-7c1d-4c53-9a0e-0e1f3c6f7a10")


def resource_for_class(resource_class: str) -> ResourceName:
    """Placement resource class → hvfleet resource name (VCPU → cpu,
    CUSTOM_HUGEPAGES_32MI → hugepages-32Mi, CUSTOM_NIC_VF → itself)."""
    known = resource_of_class(resource_class)
    if known is not None and known.placement.resource_class == resource_class:
        return known
    return ResourceName.parse(resource_class, where="placement")


def _units_down(r: ResourceName, q: Quantity | Fraction) -> int:
    return r.to_placement_units(q.value if isinstance(q, Quantity) else q)


def _units_up(r: ResourceName, q: Quantity | Fraction) -> int:
    value = q.value if isinstance(q, Quantity) else q
    return math.ceil(value / r.placement.base_per_unit)


def provider_uuid(h: Hypervisor) -> str:
    return h.metadata.uid or str(uuid.uuid5(_PROVIDER_NS, h.name))


def export_inventories(
    h: Hypervisor, policies: Sequence[OvercommitPolicy] = (),
    units: Mapping[ResourceName, UnitConstraint] | None = None,
) -> dict[str, dict[str, Any]]:
    """Placement inventories for `h`, keyed by resource class; allocation_ratio
    is the effective ratio (the host's own, else a matching policy's).
    `units`: its unit constraints, when read already (else from its
    annotations: InvalidInput when one is not one)."""
    if units is None:
        units = unit_constraints(h)
    ratios = overcommit_ratios(h, policies)
    physical = add([h.status.capacity, h.spec.extra_capacity])
    usable = usable_capacity(h.status.capacity, h.spec.reserved, h.spec.extra_capacity)
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(physical, key=str):
        if not r.in_placement:
            continue  # no Placement class: see `omitted`
        total = _units_down(r, physical[r])
        if total < 1:
            continue  # Placement refuses an inventory of 0; nothing could fit anyway.
        reserved = min(total, _units_up(r, h.spec.reserved.get(r, Quantity(0))))
        c = units.get(r)
        out[r.placement.resource_class] = {
            "total": total,
            "reserved": reserved,
            "min_unit": _units_up(r, c.min_unit) if c and c.min_unit else 1,
            # Placement wants max_unit >= 1; with nothing usable the capacity is 0.
            "max_unit": max(1, min(total - reserved, _units_down(r, usable.get(r, Quantity(0))))),
            "step_size": _units_down(r, c.step_size) if c and c.step_size else 1,
            "allocation_ratio": float(ratios.get(r, 1.0)),
        }
    return out


def export_usages(h: Hypervisor, reservations: Iterable[Reservation], now: datetime | None) -> dict[str, int]:
    """What Placement would count as used: the allocation libvirt sees plus what
    reservations hold (`held_resources`: all of a Pending/Active one, and of a
    Confirmed one what the agent does not discover, while its instance runs),
    each in whole units rounded up, so the usages are the sum of the
    allocations each consumer is shown with (`units_of`), as in Placement."""
    out = units_of(h.status.allocation)
    for res in reservations:
        if res.spec.hypervisor == h.name:
            for rc, n in units_of(held_resources(res, h, now)).items():
                out[rc] = out.get(rc, 0) + n
    return {rc: out[rc] for rc in sorted(out) if out[rc] > 0}


def units_of(resources: ResourceList) -> dict[str, int]:
    """hvfleet amounts as Placement's: resource class -> whole units (rounded up)."""
    out: dict[str, int] = {}
    for name, q in resources.items():
        if q > 0 and name.in_placement:
            rc = name.placement.resource_class
            out[rc] = out.get(rc, 0) + _units_up(name, q)
    return out


def _by_consumer(pairs: Iterable[tuple[str, ResourceList]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for consumer, resources in pairs:
        for rc, n in units_of(resources).items():
            mine = out.setdefault(consumer, {})
            mine[rc] = mine.get(rc, 0) + n
    return out


@dataclass(frozen=True, eq=False)
class HostProvider:
    """A hypervisor as Placement's root provider, judged at one time: what the
    host itself decides of it (everything but the stored record's traits,
    aggregates and generation, which the Placement core adds). Made by
    `host_provider`, kept per host by the fleet index (one per host write, or
    per turn of the clock that changes it), read by the Placement core."""

    uuid: str
    hypervisor: Hypervisor
    # resource class -> inventory fields (`export_inventories`)
    inventories: Mapping[str, Mapping[str, Any]]
    # consumer -> resource class -> amount its claims hold now (`held_resources`)
    allocations: dict[str, dict[str, int]]
    # consumer -> resource class -> amount its claims were made for (every
    # claim Pending, Active or Confirmed): what Placement's clients read back
    made: dict[str, dict[str, int]]
    # What libvirt shows in use beyond any claim (`export_usages` less `allocations`).
    unclaimed: dict[str, int]
    # `host_readiness` at `at`: False puts COMPUTE_STATUS_DISABLED on the provider.
    ready: bool
    at: datetime
    # When the first of its holding claims expires (None: none will): the
    # provider is then another with nothing written, as when its readiness
    # turns (`readiness_turn`, judged by the keeper with the agent's Lease).
    expires: datetime | None


def host_provider(h: Hypervisor, reservations: Sequence[Reservation], policies: Sequence[OvercommitPolicy],
                  now: datetime, lease: Lease | None = None,
                  staleness: timedelta = DEFAULT_STALENESS) -> HostProvider:
    """The root provider of `h` at `now`, with `placement export`'s inventories
    and usages, and readiness as `fit` and a claim judge it (`host_readiness`)."""
    allocations = _by_consumer((r.spec.consumer, held_resources(r, h, now)) for r in reservations)
    made = _by_consumer((r.spec.consumer, r.spec.resources) for r in reservations
                        if reservation_phase(r, h, now) in (*HOLDING_PHASES, "Confirmed"))
    total = export_usages(h, reservations, now)
    claimed: dict[str, int] = {}
    for resources in allocations.values():
        for rc, n in resources.items():
            claimed[rc] = claimed.get(rc, 0) + n
    unclaimed = {rc: n - claimed.get(rc, 0) for rc, n in total.items() if n > claimed.get(rc, 0)}
    expiring = [r.spec.expires_at for r in reservations
                if r.spec.expires_at is not None and holds_space(r, h, now)]
    try:
        units, valid = unit_constraints(h), True
    except InvalidInput:
        # An annotation stored before the write-time check (hvfleet.model.units):
        # the host is out of scheduling, as `fit` takes it out, and the fleet stays readable.
        units, valid = {}, False
    return HostProvider(
        uuid=provider_uuid(h), hypervisor=h, inventories=export_inventories(h, policies, units),
        allocations=allocations, made=made, unclaimed=unclaimed,
        ready=valid and host_readiness(h, lease, now, staleness).ready, at=now,
        expires=min(expiring, default=None),
    )


def omitted(h: Hypervisor) -> list[str]:
    """The resources of `h` (its capacity, extra capacity, reserve or
    overcommit) that no Placement class can carry, stored before the
    write-time check: left out of its provider."""
    named = {*h.status.capacity, *h.spec.extra_capacity, *h.spec.reserved, *h.spec.overcommit}
    return sorted(str(r) for r in named if not r.in_placement)


def _why_omitted(name: str) -> str:
    own = resource_of_class(name)
    if own is not None:
        return (f"{name} is Placement's class of {own!r}, which the provider's {name} inventory is "
                "made of (stored before hvfleet refused such names): left out of its provider")
    return (f"{name} can never be a Placement resource class (stored before hvfleet refused such "
            "names): left out of its provider")


def export_provider(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    now: datetime | None,
    policies: Sequence[OvercommitPolicy] = (),
) -> dict[str, Any]:
    return {
        "name": h.name,
        "uuid": provider_uuid(h),
        "inventories": export_inventories(h, policies),
        "usages": export_usages(h, reservations, now),
    }


def export_fleet(
    store: Store, selector: Selector | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """The Placement view of the hosts matching `selector`, read from `store`:
    what `hvfleet placement export` prints and the API's placement action answers."""
    hosts = store.list_hypervisors(selector)
    by_host = reservations_by_host(store.list_reservations())
    return export(hosts, by_host, now or datetime.now(UTC), store.list_overcommit_policies())


def export(
    hosts: Iterable[Hypervisor],
    reservations: Mapping[str, list[Reservation]],
    now: datetime,
    policies: Sequence[OvercommitPolicy] = (),
) -> dict[str, Any]:
    providers: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    left_out: list[dict[str, str]] = []
    for h in sorted(hosts, key=lambda h: h.name):
        try:
            providers.append(export_provider(h, reservations.get(h.name, []), now, policies))
        except InvalidInput as exc:
            # One host's annotation stored before the write-time check leaves
            # that host out, named, not the whole fleet's export.
            skipped.append({"name": h.name, "reason": str(exc)})
            continue
        left_out.extend({"name": h.name, "resource": r, "reason": _why_omitted(r)} for r in omitted(h))
    out: dict[str, Any] = {"resource_providers": providers}
    if skipped:
        out["skipped"] = skipped
    if left_out:
        out["omitted"] = left_out
    return out


def placement_resources(request: Request) -> dict[str, int]:
    """A request in Placement units (`count` instances together). Amounts must be
    whole Placement units: Placement cannot ask for half a MiB."""
    out: dict[str, int] = {}
    for r in sorted(request.resources, key=str):
        total = request.total(r).value / r.placement.base_per_unit
        if total.denominator != 1:
            raise InvalidInput(f"{r}: {request.total(r)} is not a whole number of {r.placement.unit}")
        out[r.placement.resource_class] = int(total)
    return out


# -- sync ---------------------------------------------------------------------------


@dataclass
class SyncReport(Changes):
    unknown_providers: list[str] = field(default_factory=list)
    # What was pushed to Placement (see placement_push): None when not asked.
    resource_classes: dict[str, Any] | None = None
    inventories: dict[str, Any] | None = None
    claims: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**super().to_dict(), "unknownProviders": self.unknown_providers}
        if self.resource_classes is not None:
            out["resourceClasses"] = self.resource_classes
        if self.inventories is not None:
            out["inventories"] = self.inventories
        if self.claims is not None:
            out["claims"] = self.claims
        out["errors"] = self.errors
        return out


def mirror_name(host: str, consumer: str) -> str:
    """Deterministic, so two syncs racing each other create the same object once."""
    digest = hashlib.sha256(f"{host}\0{consumer}".encode()).hexdigest()[:24]
    return f"placement-{digest}"


def _from_placement(resources: Mapping[str, int], where: str) -> dict[ResourceName, Quantity]:
    out: dict[ResourceName, Quantity] = {}
    for cls, amount in resources.items():
        r = resource_for_class(cls)
        if not isinstance(amount, int) or amount < 0:
            raise InvalidInput(f"{where}: {cls} amount {amount!r} is not a whole number")
        if amount:
            base = r.from_placement_units(amount)
            out[r] = r.quantity(base)
    return out


def desired_mirrors(
    client: PlacementClient,
    hosts: Mapping[str, Hypervisor],
    skip: Callable[[str], bool] = lambda consumer: False,
    allocations: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[dict[tuple[str, str], dict[ResourceName, Quantity]], list[str]]:
    """(host, consumer) → resources Placement has allocated that libvirt does not
    count: every allocation before its instance shows up, and after that each
    allocation whose claim would still hold something (`claim_holds`, as every
    claim is judged: resources the agent does not discover, what exceeds
    libvirt's count of the instance, such as a resize not yet applied, or all
    of it while the allocation leaves the instance out). A mirror is kept
    whole; `held_resources` holds only that part while the instance is
    listed. Plus the
    names of providers that match no hypervisor. A nested provider (a GPU or
    NIC under a compute node) belongs to the hypervisor of its root, and a
    consumer's allocations on a host's providers add up.
    Consumers `skip` names (hvfleet's own claims) are not mirrored;
    `allocations` are providers' allocations already read in this sync."""
    by_uid = {h.metadata.uid: h for h in hosts.values() if h.metadata.uid}
    providers = client.get("/resource_providers")["resource_providers"]
    by_uuid = {rp["uuid"]: rp for rp in providers}

    def hypervisor_of(rp: dict[str, Any]) -> Hypervisor | None:
        h = by_uid.get(rp["uuid"]) or hosts.get(rp["name"])
        root = by_uuid.get(rp.get("root_provider_uuid") or rp["uuid"])
        if h is None and root is not None and root is not rp:
            h = by_uid.get(root["uuid"]) or hosts.get(root["name"])
        return h

    desired: dict[tuple[str, str], dict[ResourceName, Quantity]] = {}
    unknown: list[str] = []
    for rp in providers:
        h = hypervisor_of(rp)
        if h is None:
            unknown.append(rp["name"])
            continue
        on_rp = (allocations or {}).get(rp["uuid"])
        if on_rp is None:
            on_rp = client.get(f"/resource_providers/{rp['uuid']}/allocations")["allocations"]
        for consumer, alloc in on_rp.items():
            resources = _from_placement(alloc["resources"], f"placement consumer {consumer}")
            if resources:
                mine = desired.setdefault((h.name, consumer), {})
                for r, q in resources.items():
                    mine[r] = mine[r] + q if r in mine else q
    for (host, consumer), resources in list(desired.items()):
        if not claim_holds(consumer, resources, hosts[host]):
            # libvirt shows the instance and its allocation counts all of it. A
            # running instance with a VGPU or VF, a resize not yet applied or
            # an instance the allocation leaves out keeps its mirror: that
            # part holds space (held_resources) while the instance is there.
            del desired[(host, consumer)]
        elif skip(consumer):
            del desired[(host, consumer)]  # hvfleet's own claim: a mirror would count it twice
    return desired, sorted(unknown)


def sync(
    store: Store,
    client: PlacementClient,
    manager: str = MANAGER,
    *,
    push_inventories: bool = True,
    push_claims: bool = False,
    identity: PushIdentity = PushIdentity(),
    now: datetime | None = None,
) -> SyncReport:
    """Push hvfleet's inventories (and with `push_claims` its live claims) to the
    providers of its hypervisors, then make the store's placement-sourced
    reservations equal what Placement has promised and libvirt does not show
    yet. Idempotent."""
    hosts = {h.name: h for h in store.list_hypervisors()}
    reservations = store.list_reservations()
    computed: dict[str, dict[str, dict[str, Any]]] = {}
    unpushed: list[str] = []
    if push_inventories:
        policies = store.list_overcommit_policies()
        for name, h in hosts.items():
            try:
                computed[name] = export_inventories(h, policies)
            except InvalidInput as exc:
                unpushed.append(f"{name}: inventories not pushed: {exc}")
    pushed = push(
        client,
        hosts,
        reservations,
        computed,
        now or datetime.now(UTC),
        inventories=push_inventories,
        claims=push_claims,
        identity=identity,
    )
    desired, unknown = desired_mirrors(client, hosts, pushed.skip, pushed.allocations)
    report = SyncReport(
        unknown_providers=unknown,
        resource_classes=pushed.resource_classes.to_dict() if pushed.resource_classes else None,
        inventories=pushed.inventories.to_dict() if pushed.inventories else None,
        claims=pushed.claims.to_dict() if pushed.claims else None,
        errors=[*unpushed, *pushed.errors],
    )
    existing = {
        (r.spec.hypervisor, r.spec.consumer): r
        for r in reservations
        if r.spec.source == "placement"
    }
    for key, resources in sorted(desired.items()):
        host, consumer = key
        current = existing.get(key)
        if current is None:
            obj = Reservation(
                metadata=ObjectMeta(
                    name=mirror_name(host, consumer), labels=reservation_labels(host, "placement")
                ),
                spec=ReservationSpec(
                    hypervisor=host, resources=resources, consumer=consumer, source="placement"
                ),
                status=ReservationStatus(phase="Active"),
            )
            try:
                store.create(obj, manager)
                report.created.append(obj.name)
            except AlreadyExists:
                report.unchanged += 1
        elif dict(current.spec.resources) != resources or current.status.phase != "Active":
            spec = current.spec.model_copy(update={"resources": resources})
            status = current.status.model_copy(update={"phase": "Active"})
            try:
                store.update(current.model_copy(update={"spec": spec, "status": status}), manager)
                report.updated.append(current.name)
            except Conflict:
                pass  # changed meanwhile; the next sync converges
        else:
            report.unchanged += 1
    for key, current in sorted(existing.items()):
        if key not in desired:
            try:
                store.delete("Reservation", current.name, current.metadata.resource_version)
                report.deleted.append(current.name)
            except (Conflict, NotFound):
                pass
    return report
