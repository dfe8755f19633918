"""Capacity arithmetic: the one place where effective and free capacity are computed.

    effective[r] = floor((⌊capacity[r] + extraCapacity[r]⌋ − ⌈reserved[r]⌉) × overcommit[r])

is OpenStack Placement's `(total − reserved) × allocation_ratio`, with a ratio
of 1 where none is given; with nothing reserved it equals the seed's node agent.
Placement counts whole units of each resource's class (a vCPU, a MiB of
MEMORY_MB, a GiB of DISK_GB, a page: `ResourceName.placement`), so the
amounts it is given are whole units too, taken as Nova's compute service
reports them: a total rounded down (⌊ ⌋: 15.6 GiB of memory seen by libvirt in
KiB is 15,974 MiB), a reserve rounded up (⌈ ⌉), the allocation libvirt counts
rounded up, and each claim's holding rounded up (a claim stored before claims
had to be whole units). So hvfleet's free space is Placement's, to the unit:
fit, claims and the served Placement API never disagree at the margin.
Ratios are taken at the decimal value a person wrote (`1.1`, not the binary
float 1.1000000000000000888), so the arithmetic is exact and never drifts.
A single request may not exceed `⌊capacity + extra⌋ − ⌈reserved⌉` (Placement's
`max_unit`): overcommit makes room for more guests, not bigger ones.
Every consumer (agent, scheduling, API, dashboard, CLI) calls these functions.
The ratio of a resource is the host's own, else that of the matching
OvercommitPolicy (`policies`, resolved by `hvfleet.model.overcommit`), else 1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from fractions import Fraction

from hvfleet.model.hypervisor import (
    HOLDING_PHASES,
    Cell,
    CountMode,
    Hypervisor,
    Instance,
    OvercommitPolicy,
    Reservation,
    ReservationPhase,
    ResourceList,
)
from hvfleet.model.overcommit import effective_overcommit
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import MEMORY, ResourceName


@functools.lru_cache(maxsize=1024)  # a fleet has a handful of ratios; parsing one is slow
def exact_ratio(ratio: float) -> Fraction:
    """The decimal a ratio was written as (repr of a float is its shortest
    round-tripping decimal)."""
    return Fraction(repr(float(ratio)))


_ZERO = Quantity(0)  # immutable: one for every absent resource
_NO_RATIO = Fraction(1)
_NONE = Fraction(0)


def _get(values: Mapping[ResourceName, Quantity], r: ResourceName) -> Quantity:
    return values.get(r, _ZERO)


@functools.lru_cache(maxsize=4096)  # a fleet names a handful of resources; read per host per resource
def _unit(r: ResourceName) -> int:
    return r.placement.base_per_unit


def _whole(value: Fraction, unit: int) -> bool:
    # Integers first: nearly every amount is one, and Fraction division is slow.
    return value.denominator == 1 and value.numerator % unit == 0


def _to_units(r: ResourceName, q: Quantity, rounding: Callable[[Fraction], int]) -> Quantity:
    unit = _unit(r)
    value = q.value
    if _whole(value, unit):
        return q
    return Quantity(rounding(value / unit) * unit, q.format)


def units_down(r: ResourceName, q: Quantity) -> Quantity:
    """`q` rounded down to whole units of `r`'s Placement class (a total)."""
    return _to_units(r, q, math.floor)


def units_up(r: ResourceName, q: Quantity) -> Quantity:
    """`q` rounded up to whole units of `r`'s Placement class (a reserve, a use)."""
    return _to_units(r, q, math.ceil)


def _units_up_all(values: Mapping[ResourceName, Quantity]) -> Mapping[ResourceName, Quantity]:
    """`values` with each amount rounded up to whole units (`values` itself
    when every one is whole already, as nearly always)."""
    if all(_whole(q.value, _unit(r)) for r, q in values.items()):
        return values
    return {r: units_up(r, q) for r, q in values.items()}


def usable_capacity(
    capacity: Mapping[ResourceName, Quantity],
    reserved: Mapping[ResourceName, Quantity],
    extra: Mapping[ResourceName, Quantity] | None = None,
    *,
    whole: bool = True,
) -> ResourceList:
    """⌊capacity + extra⌋ − ⌈reserved⌉ in whole units of each resource's
    Placement class, never below 0: also Placement's max_unit. With `whole`
    False, exactly (a NUMA cell's share of the host's reserve)."""
    extra = extra or {}
    out: ResourceList = {}
    for r in sorted(set(capacity) | set(extra), key=str):
        if whole:
            total = units_down(r, _get(capacity, r) + _get(extra, r)) - units_up(r, _get(reserved, r))
        else:
            total = _get(capacity, r) + _get(extra, r) - _get(reserved, r)
        fmt = (capacity.get(r) or extra.get(r) or _ZERO).format
        out[r] = total if total.value >= 0 and total.format == fmt else Quantity(max(total.value, _NONE), fmt)
    return out


def effective_capacity(
    capacity: Mapping[ResourceName, Quantity],
    overcommit: Mapping[ResourceName, float],
    reserved: Mapping[ResourceName, Quantity] | None = None,
    extra: Mapping[ResourceName, Quantity] | None = None,
    *,
    whole: bool = True,
) -> ResourceList:
    """floor((⌊capacity + extra⌋ − ⌈reserved⌉) × ratio) per resource, in whole
    units of its Placement class, never below 0 (`whole`: as `usable_capacity`;
    without, exact and then floored to a unit)."""
    out: ResourceList = {}
    for r, usable in usable_capacity(capacity, reserved or {}, extra, whole=whole).items():
        ratio = exact_ratio(overcommit[r]) if r in overcommit else _NO_RATIO
        unit = _unit(r)
        if ratio == 1 and (whole or _whole(usable.value, unit)):
            out[r] = usable  # whole units already: floor(usable × 1) is usable itself
        else:
            out[r] = Quantity(math.floor(usable.value / unit * ratio) * unit, usable.format)
    return out


def overcommit_ratios(
    h: Hypervisor, policies: Sequence[OvercommitPolicy] = ()
) -> dict[ResourceName, float]:
    """The overcommit ratios in effect on `h` (1 for a resource not listed): the
    one place they come from, for effective capacity, its cells and the
    Placement export's allocation_ratio. The host's own spec.overcommit, else
    a matching OvercommitPolicy's (precedence in `hvfleet.model.overcommit`)."""
    return effective_overcommit(h, policies)


def max_unit(h: Hypervisor) -> ResourceList:
    """The largest single request the host accepts per resource."""
    return usable_capacity(h.status.capacity, h.spec.reserved, h.spec.extra_capacity)


def hypervisor_effective_capacity(
    h: Hypervisor, policies: Sequence[OvercommitPolicy] = ()
) -> ResourceList:
    """THE effective capacity of a host, for every reader: computed from its
    current spec (ratios, reserve, extra capacity), the OvercommitPolicies that
    match it, and the capacity its agent observed. `status.effectiveCapacity`
    is the agent's copy of this same value (`with_effective_capacity`) for
    readers of the raw object; it lags while metadata.generation >
    status.observedGeneration (views say so)."""
    return effective_capacity(
        h.status.capacity, overcommit_ratios(h, policies), h.spec.reserved, h.spec.extra_capacity
    )


def cell_effective_capacity(
    cell: Cell,
    host_capacity: Mapping[ResourceName, Quantity],
    h: Hypervisor,
    policies: Sequence[OvercommitPolicy] = (),
) -> ResourceList:
    """The same formula per NUMA cell. The host reserve is host-wide, so each cell
    carries the share of it that its capacity is of the host's: of the reserve
    in whole units (`units_up`, as the host counts it), exact, and the cell's
    capacity floored to a unit only at the end, so the reserve is counted once
    across the cells, not rounded up in each; extraCapacity is invisible to
    libvirt and belongs to no cell."""
    reserved: ResourceList = {}
    for r, q in h.spec.reserved.items():
        host_total = host_capacity.get(r)
        cell_total = cell.capacity.get(r)
        if host_total and cell_total is not None:
            reserved[r] = Quantity(units_up(r, q).value * cell_total.value / host_total.value, q.format)
    return effective_capacity(cell.capacity, overcommit_ratios(h, policies), reserved, whole=False)


def with_effective_capacity(h: Hypervisor, policies: Sequence[OvercommitPolicy] = ()) -> Hypervisor:
    """`h` with status.effectiveCapacity (host and cells) recomputed from spec
    and the OvercommitPolicies that match it."""
    cells = [
        c.model_copy(
            update={"effective_capacity": cell_effective_capacity(c, h.status.capacity, h, policies)}
        )
        for c in h.status.cells
    ]
    status = h.status.model_copy(
        update={"effective_capacity": hypervisor_effective_capacity(h, policies), "cells": cells}
    )
    return h.model_copy(update={"status": status})


def add(lists: Iterable[Mapping[ResourceName, Quantity]]) -> ResourceList:
    out: ResourceList = {}
    for values in lists:
        for r, q in values.items():
            out[r] = out[r] + q if r in out else Quantity(q)
    return out


def subtract(
    a: Mapping[ResourceName, Quantity], b: Mapping[ResourceName, Quantity]
) -> ResourceList:
    if not b:  # nothing to take away (most hosts have no reservation)
        return {r: a[r] for r in sorted(a, key=str)}
    return {r: _get(a, r) - _get(b, r) for r in sorted(set(a) | set(b), key=str)}


def discovered_resources(h: Hypervisor) -> frozenset[ResourceName]:
    """The resources the node agent discovers on `h`: exactly those it reports
    in `status.capacity` or `status.allocation`. The agent counts a resource's
    allocation from libvirt's domains for every resource it reports capacity
    of (cpu, memory, hugepages today), so for these the allocation includes a
    running instance's share. Anything else (VGPU, CUSTOM_NIC_VF, disk, any
    capacity that only `spec.extraCapacity` gives) libvirt never shows in the
    allocation, and a reservation keeps holding it while its instance runs."""
    return frozenset(h.status.capacity) | frozenset(h.status.allocation)


def consumer_present(res: Reservation, h: Hypervisor | None) -> bool:
    """Whether the reservation's instance exists on its host (per the agent),
    in any state: from then on the reservation is Confirmed and no longer
    expires (`reservation_phase`); what it holds depends on whether libvirt's
    allocation counts the instance (`held_resources`)."""
    return instance_of(res.spec.consumer, h) is not None


def instance_of(consumer: str, h: Hypervisor | None) -> Instance | None:
    """The consumer's instance on `h` as the agent lists it (in any state), or None."""
    if h is None:
        return None
    return next((i for i in h.status.instances if i.uuid == consumer), None)


# Domain states (as `status.instances[].state` words them: virsh's, with
# "shut off" as "shutoff") with no QEMU process holding resources. The agent
# leaves these out of the allocation under `--count running`. Not "crashed":
# libvirt keeps a domain in that state only while its QEMU process is kept
# (on_crash=preserve, a core dump being written), still holding its memory,
# and calls it active (virDomainIsActive); a crash that ends the process
# leaves it shut off (reason crashed).
INACTIVE_STATES: frozenset[str] = frozenset({"shutoff"})


def counts_in_allocation(state: str, count_mode: CountMode | None) -> bool:
    """Whether the agent counts a domain in `state` in the host's allocation
    under `count_mode`: an active one always (a crashed one kept by libvirt
    is active); a shut-off one only under `--count defined`. Where the mode is not known (a status written
    before the agent recorded it), a shut-off one is taken as not counted, so
    a claim for it holds all it asks rather than nothing."""
    return state not in INACTIVE_STATES or count_mode == "defined"


def counted_in_allocation(instance: Instance, h: Hypervisor) -> bool:
    """Whether `h`'s `status.allocation` counts `instance` (one of its
    `status.instances`), judged from what the status says: the instance's
    state and the agent's count mode (`counts_in_allocation`)."""
    return counts_in_allocation(instance.state, h.status.count_mode)


def beyond_libvirt(
    resources: Mapping[ResourceName, Quantity], instance: Instance, h: Hypervisor
) -> ResourceList:
    """What a claim of `resources` holds while its consumer's `instance` is
    listed on `h`: all of it while libvirt's allocation does not count the
    instance (shut off or crashed under `--count running`:
    `counted_in_allocation`); otherwise all of each resource the agent does
    not discover there (libvirt's allocation never counts it: VGPU, VFs), and
    of each it does, what exceeds libvirt's count of that instance
    (`instance.resources`, in whole units rounded down: `units_down`), which
    the host's allocation already has: a resize
    not yet applied to the domain. So the instance counts once, as Placement
    counts an allocation once (usage − old + new). An instance listed without
    resources (a status not written by the agent, which always lists them) is
    taken to count all the claim has of what libvirt sees."""
    if not counted_in_allocation(instance, h):
        return dict(resources)
    seen = discovered_resources(h)
    counted = instance.resources
    out: ResourceList = {}
    for r, q in resources.items():
        if r not in seen:
            out[r] = q
        elif counted:
            libvirt = _counted_of(counted, r)
            if libvirt is None:
                out[r] = q
            elif q > libvirt:
                # Rounded down to whole units: the part of a unit libvirt counts
                # is in the host's allocation, which free space rounds up; rounding
                # this up too would count the instance one unit over its claim.
                beyond = units_down(r, q - libvirt)
                if beyond.value > 0:
                    out[r] = beyond
    return out


def _guest_memory(r: ResourceName) -> bool:
    """Whether `r` is a guest's RAM, whichever pool backs it (plain memory or
    hugepages of any size): Placement (and so Nova) claims a hugepage-backed
    guest's memory as MEMORY_MB, while libvirt counts it in the hugepage
    pool's resource and shows 0 of plain memory."""
    return r == MEMORY or r.page_size is not None


def _counted_of(counted: Mapping[ResourceName, Quantity], r: ResourceName) -> Quantity | None:
    """libvirt's count of `r` for one instance (`counted`: its resources),
    None where it lists none; a claim's memory is covered by the guest's RAM
    in every page size."""
    if r != MEMORY:
        return counted.get(r)
    total: Quantity | None = None
    for m in sorted(counted, key=str):
        if _guest_memory(m):
            total = counted[m] if total is None else total + counted[m]
    return total


def claim_holds(
    consumer: str, resources: Mapping[ResourceName, Quantity], h: Hypervisor
) -> ResourceList:
    """What a new claim of `resources` for `consumer` would hold on `h` now
    (as `held_resources` judges it once written): everything, unless the
    consumer's instance is already listed there (`beyond_libvirt`: still
    everything while libvirt's allocation does not count it), in whole units
    as `free_capacity` counts it. This, not the whole request, is what the
    claim needs free."""
    instance = instance_of(consumer, h)
    return dict(_units_up_all(resources if instance is None else beyond_libvirt(resources, instance, h)))


def reservation_phase(
    res: Reservation, h: Hypervisor | None, now: datetime | None = None
) -> ReservationPhase:
    """The phase a reservation is in now, derived the same way everywhere:
    Confirmed once its consumer shows up in the host's instances, in any state
    (it then covers that instance for its lifetime and no longer expires;
    what it holds is `held_resources`: all of it while libvirt's allocation
    does not count the instance, e.g. shut off under `--count running`),
    Expired once expiresAt has passed. A stored Confirmed (recorded by gc) stays Confirmed; it holds
    nothing once the instance is gone (`held_resources`)."""
    phase = res.status.phase
    if phase not in HOLDING_PHASES:
        return phase
    if consumer_present(res, h):
        return "Confirmed"
    if now is not None and res.spec.expires_at is not None and res.spec.expires_at <= now:
        return "Expired"
    return phase


def growth_past_claim(old: Reservation, new: Reservation, now: datetime) -> tuple[str, str] | None:
    """Where an update of `old` to `new` would make the reservation hold more
    than its claim checked, as (field, what), or None. Only a claim checks free
    capacity inside the store's atomic write, so an update may shrink, release
    or confirm a reservation, but never grow a resource, add one, move it to
    another host, or revive one that stopped holding (Released, Expired,
    Confirmed). Judged without the host: its instances only ever make a
    reservation hold less. A mirror of a Placement allocation (source
    `placement`, kept so by `placement sync`) follows what Placement decided.
    Who promised the space (`spec.source`) never changes: no writer changes it
    (sync updates only its mirrors, and a Placement allocation replaces a claim
    by a new one), and a claim turned mirror would then grow unchecked."""
    if new.spec.source != old.spec.source:
        return "spec.source", f"{old.spec.source} → {new.spec.source}"
    if old.spec.source == "placement":
        return None
    if new.spec.hypervisor != old.spec.hypervisor:
        return "spec.hypervisor", f"{old.spec.hypervisor} → {new.spec.hypervisor}"
    for r, q in sorted(new.spec.resources.items(), key=lambda kv: str(kv[0])):
        before = old.spec.resources.get(r)
        if before is None or q > before:
            return "spec.resources", f"{r} {before if before is not None else 'absent'} → {q}"
    if not holds_space(old, None, now) and holds_space(new, None, now):
        was, becomes = reservation_phase(old, None, now), reservation_phase(new, None, now)
        return "status.phase", f"{was} → {becomes}"
    return None


def covers_consumer(res: Reservation, h: Hypervisor | None, now: datetime | None = None) -> bool:
    """Whether the reservation is still its consumer's claim on its host: while
    it holds all it reserved (Pending, Active), and while Confirmed with its
    instance there (it covers that instance for its lifetime, holding what
    libvirt does not see). A consumer holds at most one such claim per host; a
    recorded Confirmed whose instance is gone covers nothing."""
    phase = reservation_phase(res, h, now)
    return phase in HOLDING_PHASES or (phase == "Confirmed" and consumer_present(res, h))


def holds_space(res: Reservation, h: Hypervisor | None, now: datetime | None = None) -> bool:
    """Whether the reservation holds all it reserved (it is Pending or Active)."""
    return reservation_phase(res, h, now) in HOLDING_PHASES


def held_resources(
    res: Reservation, h: Hypervisor | None, now: datetime | None = None
) -> ResourceList:
    """What the reservation holds on `h` now: everything while Pending or Active;
    while Confirmed and its instance exists on the host, what libvirt's
    allocation does not count of it (`beyond_libvirt`: everything while the
    allocation leaves the instance out, else the resources the agent does not
    discover there, and what the claim has beyond the instance's own count of
    those it does); nothing otherwise (Released, Expired, or the
    instance is gone). In whole units of each resource's Placement class,
    rounded up (a claim stored before claims had to be whole units): what
    free space, Placement's usages and every view count."""
    phase = reservation_phase(res, h, now)
    if phase in HOLDING_PHASES:
        return dict(_units_up_all(res.spec.resources))
    if phase == "Confirmed" and h is not None:
        instance = instance_of(res.spec.consumer, h)
        if instance is not None:
            return dict(_units_up_all(beyond_libvirt(res.spec.resources, instance, h)))
    return {}


def free_capacity(
    h: Hypervisor,
    reservations: Iterable[Reservation] = (),
    now: datetime | None = None,
    policies: Sequence[OvercommitPolicy] = (),
    effective: ResourceList | None = None,
) -> ResourceList:
    """effective − allocation − space held by reservations on this host
    (`held_resources`), in whole units of each resource's Placement class: the
    allocation and each claim's holding rounded up, as Placement counts them.
    Negative means overcommitted beyond what spec allows. `effective` is
    `hypervisor_effective_capacity(h, policies)` where the caller has it
    already."""
    held = add(held_resources(r, h, now) for r in reservations if r.spec.hypervisor == h.name)
    if effective is None:
        effective = hypervisor_effective_capacity(h, policies)
    return subtract(subtract(effective, _units_up_all(h.status.allocation)), held)
