"""Capacity as a person reads it: one host's resources and NUMA cells
(`describe hypervisor`), and the fleet's capacity per host and in total
(`capacity`, its JSON document, the dashboard's totals). The figures come
from `hvfleet.model.capacity` and readiness from `hvfleet.model.readiness`;
nothing is recomputed here. `FleetTotals` is the one fleet-totals
implementation, full and incremental.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any, Literal

from hvfleet.model import capacity as cap
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Reservation, ResourceList
from hvfleet.model.overcommit import resolve_overcommit
from hvfleet.model.quantity import Quantity
from hvfleet.model.readiness import DEFAULT_STALENESS, Readiness, readiness
from hvfleet.model.resources import CPU, MEMORY, ResourceName
from hvfleet.model.spec_sync import SpecSync, spec_sync
from hvfleet.views.text import Column, human, ratio_text, strs, used_of

# Free capacity below this share of effective is "low" (the CLI shows it yellow).
LOW_FREE = Fraction(1, 10)


# -- one host's capacity (`describe hypervisor`) ------------------------------------------------

_CAPACITY_DETAIL_COLUMNS = (
    Column("RESOURCE"),
    Column("CAPACITY", description="status.capacity (what libvirt shows)"),
    Column("EXTRA", description="spec.extraCapacity (what libvirt cannot see)"),
    Column("RESERVED", description="spec.reserved"),
    Column("OVERCOMMIT", description="ratio: spec, else a matching OvercommitPolicy's (named), else 1"),
    Column("EFFECTIVE", description="floor((capacity + extra − reserved) × overcommit)"),
    Column("ALLOCATED", description="status.allocation"),
    Column("FREE", description="effective − allocated − held by reservations"),
    Column("MAX UNIT", description="largest single request: capacity + extra − reserved"),
)


def capacity_detail_columns() -> list[Column]:
    return list(_CAPACITY_DETAIL_COLUMNS)


def capacity_detail_rows(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    now: datetime,
    policies: Sequence[OvercommitPolicy] | None = None,
) -> list[list[str]]:
    """Per resource of `h`, the cells of `capacity_detail_columns()`."""
    eff = cap.hypervisor_effective_capacity(h, policies or ())
    free = cap.free_capacity(h, reservations, now, policies or ())
    ratios = resolve_overcommit(h, policies or ())
    mx = cap.max_unit(h)
    names = sorted(set(h.status.capacity) | set(h.spec.extra_capacity) | set(eff), key=str)
    rows = []
    for r in names:
        ratio = ratios.get(r)
        rows.append([
            str(r),
            human(r, h.status.capacity.get(r)),
            human(r, h.spec.extra_capacity.get(r)) if r in h.spec.extra_capacity else "-",
            human(r, h.spec.reserved.get(r)) if r in h.spec.reserved else "-",
            "1" if ratio is None else ratio_text(ratio.value, ratio.source),
            human(r, eff.get(r)),
            human(r, h.status.allocation.get(r, Quantity(0))),
            human(r, free.get(r)),
            human(r, mx.get(r)),
        ])
    return rows


_CELL_COLUMNS = (
    Column("CELL", "integer", "NUMA cell id"),
    Column("RESOURCE"),
    Column("CAPACITY", description="the cell's status.capacity"),
    Column("EFFECTIVE", description="under the current spec (the cell's share of the reserve)"),
    Column("ALLOCATED", description="the cell's status.allocation"),
)


def cell_columns() -> list[Column]:
    return list(_CELL_COLUMNS)


def cell_rows(h: Hypervisor, policies: Sequence[OvercommitPolicy] | None = None) -> list[list[str]]:
    """Per NUMA cell and resource, the cells of `cell_columns()`. Effective
    capacity is computed from the current spec and policies, as for the host,
    not read from the agent's (possibly lagging) copy in status."""
    rows = []
    for c in h.status.cells:
        eff = cap.cell_effective_capacity(c, h.status.capacity, h, policies or ())
        for r in sorted(c.capacity, key=str):
            rows.append([str(c.id), str(r), human(r, c.capacity.get(r)), human(r, eff.get(r)),
                         human(r, c.allocation.get(r, Quantity(0)))])
    return rows


# -- the fleet's capacity (`capacity`) ----------------------------------------------------------

FreeLevel = Literal["ok", "low", "overcommitted"]


def free_level(free: Quantity | None, effective: Quantity | None) -> FreeLevel:
    """`overcommitted` below 0 (more is used than spec allows), `low` under
    LOW_FREE of effective, `ok` otherwise."""
    if free is None:
        return "ok"
    if free < 0:
        return "overcommitted"
    if effective is not None and effective > 0 and free.value < effective.value * LOW_FREE:
        return "low"
    return "ok"


@dataclass(frozen=True)
class HostCapacity:
    name: str
    readiness: Readiness | None  # None for the total
    effective: ResourceList
    allocation: ResourceList
    free: ResourceList
    synced: SpecSync | None = None  # None for the total

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.readiness is not None:
            out["ready"] = self.readiness.ready
            out["readiness"] = self.readiness.to_dict()
        if self.synced is not None:
            out["synced"] = self.synced.to_dict()
        out.update(effective=strs(self.effective), allocation=strs(self.allocation), free=strs(self.free))
        return out


@dataclass(frozen=True)
class FleetCapacity:
    hosts: list[HostCapacity]
    total: HostCapacity

    @property
    def resources(self) -> list[ResourceName]:
        """Every resource any host has effective capacity of; cpu and memory first."""
        return resource_names(self.hosts)

    def to_dict(self) -> dict[str, Any]:
        total = self.total.to_dict()
        del total["name"]
        return {"hosts": [x.to_dict() for x in self.hosts], "total": total}


def resource_order(r: ResourceName) -> tuple[bool, str]:
    """cpu and memory first, then by name: the order of every capacity view."""
    return (r not in (CPU, MEMORY), str(r))


def resource_names(hosts: Iterable[HostCapacity]) -> list[ResourceName]:
    """Every resource any of `hosts` has effective capacity of, cpu and memory
    always, in `resource_order`."""
    found = {r for x in hosts for r in x.effective} | {CPU, MEMORY}
    return sorted(found, key=resource_order)


def _minus(a: ResourceList, b: ResourceList) -> ResourceList:
    """a − b over the resources of `a` (a sum keeps a resource listed, at 0,
    after the last host having it left)."""
    return {r: q for r, q in cap.subtract(a, b).items() if r in a}


class FleetTotals:
    """The fleet's totals: sums of the core's per-host figures (`cap.add` and
    `cap.subtract`, exact) and how many hosts are in each readiness state. The
    one implementation behind `hvfleet capacity`'s TOTAL row and the
    dashboard's totals: full (`of`), or incremental (`add`, `remove`), so a
    live view follows one host's change without adding up every host again."""

    def __init__(self) -> None:
        self.effective: ResourceList = {}
        self.allocation: ResourceList = {}
        self.free: ResourceList = {}
        self.held: ResourceList = {}
        self.states: dict[str, int] = {}
        self.hosts = 0

    @classmethod
    def of(cls, hosts: Iterable[HostCapacity],
           held: Callable[[HostCapacity], ResourceList] | None = None) -> FleetTotals:
        """The totals of `hosts`; `held(host)` is what its reservations hold."""
        out = cls()
        out.add_all((x, held(x) if held is not None else {}) for x in hosts)
        return out

    def add_all(self, hosts: Iterable[tuple[HostCapacity, ResourceList]]) -> None:
        """`add` of many (host, what its reservations hold) at once: the same
        sums in one pass per figure, without a new list per host (a fleet of
        10,000 hosts is summed in a third of the time)."""
        items = list(hosts)
        self.effective = cap.add([self.effective, *(x.effective for x, _ in items)])
        self.allocation = cap.add([self.allocation, *(x.allocation for x, _ in items)])
        self.free = cap.add([self.free, *(x.free for x, _ in items)])
        self.held = cap.add([self.held, *(h for _, h in items)])
        for x, _ in items:
            state = _state(x)
            self.states[state] = self.states.get(state, 0) + 1
        self.hosts += len(items)

    def add(self, x: HostCapacity, held: ResourceList | None = None) -> None:
        self.effective = cap.add([self.effective, x.effective])
        self.allocation = cap.add([self.allocation, x.allocation])
        self.free = cap.add([self.free, x.free])
        self.held = cap.add([self.held, held or {}])
        state = _state(x)
        self.states[state] = self.states.get(state, 0) + 1
        self.hosts += 1

    def remove(self, x: HostCapacity, held: ResourceList | None = None) -> None:
        self.effective = _minus(self.effective, x.effective)
        self.allocation = _minus(self.allocation, x.allocation)
        self.free = _minus(self.free, x.free)
        self.held = _minus(self.held, held or {})
        state = _state(x)
        self.states[state] -= 1
        if not self.states[state]:
            del self.states[state]
        self.hosts -= 1

    def total(self) -> HostCapacity:
        """The totals as the TOTAL row of `capacity` (no readiness of its own)."""
        return HostCapacity(name="TOTAL", readiness=None, effective=dict(self.effective),
                            allocation=dict(self.allocation), free=dict(self.free))

    def resources(self) -> list[ResourceName]:
        """The resources the totals have figures for, in `resource_order`."""
        return sorted(set(self.effective) | set(self.allocation), key=resource_order)


def _state(x: HostCapacity) -> str:
    return x.readiness.state if x.readiness else "Unknown"


def host_capacity(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    now: datetime,
    lease_live: bool | None = None,
    staleness: timedelta = DEFAULT_STALENESS,
    policies: Sequence[OvercommitPolicy] | None = None,
) -> HostCapacity:
    effective = cap.hypervisor_effective_capacity(h, policies or ())
    return HostCapacity(
        name=h.name,
        readiness=readiness(h, now, lease_live, staleness),
        effective=effective,
        allocation=dict(h.status.allocation),
        free=cap.free_capacity(h, reservations, now, policies or (), effective),
        synced=spec_sync(h, policies),
    )


def fleet_summary(
    hosts: Iterable[Hypervisor],
    reservations: Iterable[Reservation],
    liveness: Mapping[str, bool],
    now: datetime,
    staleness: timedelta = DEFAULT_STALENESS,
    policies: Sequence[OvercommitPolicy] | None = None,
) -> FleetCapacity:
    """Per host and in total: effective, allocated and free capacity, with each
    host's readiness. `liveness` is `Store.agent_liveness()`."""
    by_host: dict[str, list[Reservation]] = {}
    for r in reservations:
        by_host.setdefault(r.spec.hypervisor, []).append(r)
    rows = [
        host_capacity(h, by_host.get(h.name, []), now, liveness.get(h.name), staleness, policies)
        for h in hosts
    ]
    return FleetCapacity(rows, FleetTotals.of(rows).total())


@dataclass(frozen=True)
class CapacityRow:
    """One row of the `capacity` table: its cells, each cell's FreeLevel (for
    colour), and whether it is the total."""

    cells: list[str]
    levels: list[FreeLevel]
    total: bool = False


def capacity_columns(summary: FleetCapacity) -> list[Column]:
    rs = summary.resources
    return (
        [Column("HOST", format="name"), Column("READY", description="readiness"),
         Column("SYNCED", description="the agent observed the current spec")]
        + [Column(f"{str(r).upper()} USED/EFFECTIVE") for r in rs]
        + [Column(f"{str(r).upper()} FREE") for r in rs]
    )


def capacity_rows(summary: FleetCapacity) -> list[CapacityRow]:
    """The cells of `capacity_columns(summary)`: one row per host, then the total."""
    rs = summary.resources
    out = []
    for x in [*summary.hosts, summary.total]:
        cells = [
            x.name,
            x.readiness.shown if x.readiness is not None else "",
            x.synced.state if x.synced is not None else "",
        ]
        levels: list[FreeLevel] = ["ok", "ok", "ok"]
        for r in rs:
            cells.append(used_of(r, x.allocation.get(r), x.effective.get(r)))
            levels.append("ok")
        for r in rs:
            level = free_level(x.free.get(r), x.effective.get(r))
            text = human(r, x.free.get(r))
            cells.append(f"{text} (overcommitted)" if level == "overcommitted" else text)
            levels.append(level)
        out.append(CapacityRow(cells, levels, total=x is summary.total))
    return out
