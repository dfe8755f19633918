"""What a person sees of the fleet: table columns and rows, capacity summaries
and their JSON documents, the same for every edge (the CLI's tables, the HTTP
API's `Table` output and JSON, the dashboard). Pure: values in, strings and
dicts out; the numbers come from `model.capacity` and readiness from
`model.readiness`, never recomputed here.

Columns follow the Kubernetes `Table` column definition (name, type, format,
description, priority): priority 0 is the default table, 1 shows only with
`-o wide`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any, Literal

from hvfleet.model import capacity as cap
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Reservation, ResourceList
from hvfleet.model.lease import Lease, lease_live
from hvfleet.model.meta import find_condition
from hvfleet.model.overcommit import SPEC, SYNCED_CONDITION, resolve_overcommit
from hvfleet.model.quantity import Quantity
from hvfleet.model.readiness import DEFAULT_STALENESS, Readiness, readiness
from hvfleet.model.resources import CPU, MEMORY, ResourceName

# Free capacity below this share of effective is "low" (the CLI shows it yellow).
LOW_FREE = Fraction(1, 10)


# -- formatting -------------------------------------------------------------------------


def human(resource: ResourceName | str, q: Quantity | None) -> str:
    """A quantity as a person reads it: bytes as Gi/Mi with one decimal, counts
    of five digits or more with thousands separators."""
    if q is None:
        return "-"
    if ResourceName(resource).counts_bytes:
        v = float(q.value)
        for suffix, mult in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if abs(v) >= mult:
                text = f"{v / mult:.1f}".removesuffix(".0")
                return f"{text}{suffix}"
        return f"{v:.0f}"
    if q.is_integer() and abs(q.value) >= 10_000:
        # Large counts with thousands separators (738,278): four digits read at a glance.
        return f"{q.floor():,}"
    return str(q)


def age(ts: datetime | None, now: datetime) -> str:
    """kubectl's AGE: the largest whole unit (`3d`, `5h`, `12m`, `40s`)."""
    if ts is None:
        return "-"
    seconds = int((now - ts).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _pairs(values: Mapping[Any, Any], fmt: Any = str) -> str:
    return ",".join(f"{k}={fmt(k, v)}" for k, v in sorted(values.items(), key=lambda kv: str(kv[0]))) or "-"


def _used_of(r: ResourceName, used: Quantity | None, of: Quantity | None) -> str:
    return f"{human(r, used if used is not None else Quantity(0))}/{human(r, of)}"


def _strs(values: Mapping[ResourceName, Quantity]) -> dict[str, str]:
    # The exact quantity in the resource's canonical form (bytes in binary units),
    # as every JSON answer gives it (hvfleet.ops.quantities.exact).
    return {str(k): str(ResourceName(k).quantity(v))
            for k, v in sorted(values.items(), key=lambda kv: str(kv[0]))}


SyncState = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class SpecSync:
    """Whether the agent has observed the host's current spec: `True` when
    status.observedGeneration >= metadata.generation, `False` when the spec is
    newer (status.effectiveCapacity then lags; every view shows the effective
    capacity computed from the current spec), `Unknown` before any agent ran."""

    state: SyncState
    generation: int
    observed_generation: int | None
    message: str

    @property
    def pending(self) -> bool:
        return self.state == "False"

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state, "generation": self.generation,
            "observedGeneration": self.observed_generation, "message": self.message,
        }


def spec_sync(h: Hypervisor, policies: Sequence[OvercommitPolicy] | None = None) -> SpecSync:
    """Whether the agent's status.effectiveCapacity is from the current spec.
    With `policies` (the store's OvercommitPolicies), also whether it is from
    the current policies: a policy change moves no host's generation. An
    agent that could not resolve its ratios says so in its `Synced` condition,
    which comes first: its effectiveCapacity is then the last one it resolved."""
    gen, seen = h.metadata.generation, h.status.observed_generation
    if seen is None:
        return SpecSync("Unknown", gen, None, "no agent has observed this host's spec yet")
    said = find_condition(h.status.conditions, SYNCED_CONDITION)
    if said is not None and said.status == "False":
        return SpecSync(
            "False", gen, seen,
            f"{said.reason or 'NotSynced'}: {said.message}; shown is the capacity under the "
            "current spec and policies",
        )
    if seen >= gen:
        if policies is not None and h.status.capacity:
            current = cap.hypervisor_effective_capacity(h, policies)
            if current != h.status.effective_capacity:
                return SpecSync(
                    "False", gen, seen,
                    f"an OvercommitPolicy changed since the agent's last write: status.effectiveCapacity "
                    f"({_pairs(h.status.effective_capacity, human)}) is from before; shown is the capacity "
                    "under the current policies",
                )
        return SpecSync("True", gen, seen, f"the agent observed generation {gen}")
    lag = _pairs(h.status.effective_capacity, human)
    return SpecSync(
        "False", gen, seen,
        f"spec generation {gen} not yet observed by the agent (it saw {seen}): "
        f"status.effectiveCapacity ({lag}) is from then; shown is the capacity under the current spec",
    )


@dataclass(frozen=True)
class Column:
    """One column of a table, as a Kubernetes Table's columnDefinitions entry."""

    name: str
    type: Literal["string", "integer", "number", "boolean"] = "string"
    description: str = ""
    priority: int = 0
    format: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "type": self.type, "format": self.format,
            "description": self.description, "priority": self.priority,
        }


def _visible(columns: Sequence[Column], wide: bool) -> list[Column]:
    return [c for c in columns if wide or c.priority == 0]


# -- hypervisors (`get hypervisors`) ---------------------------------------------------------

_HYPERVISOR_COLUMNS = (
    Column("NAME", description="metadata.name", format="name"),
    Column("READY", description="readiness: Ready, NotReady, Stale, Unknown or Maintenance"),
    Column("CPU", description="cpu allocated / effective"),
    Column("MEMORY", description="memory allocated / effective"),
    Column("INSTANCES", "integer", "domains the agent sees"),
    Column("MAINTENANCE", description="spec.maintenance"),
    Column("SYNCED", description="the agent observed the current spec (False: effectiveCapacity lags)"),
    Column("AGE", description="since metadata.creationTimestamp"),
    Column(
        "OVERCOMMIT",
        description="effective ratios: spec.overcommit, else a matching OvercommitPolicy's (named)",
        priority=1,
    ),
    Column("RESERVED", description="spec.reserved", priority=1),
    Column("LABELS", description="metadata.labels", priority=1),
)


def hypervisor_columns(wide: bool = False) -> list[Column]:
    return _visible(_HYPERVISOR_COLUMNS, wide)


def hypervisor_row(
    h: Hypervisor,
    now: datetime,
    lease_live: bool | None = None,
    wide: bool = False,
    staleness: timedelta = DEFAULT_STALENESS,
    policies: Sequence[OvercommitPolicy] | None = None,
) -> list[str]:
    """The cells of `hypervisor_columns(wide)` for one host."""
    eff = cap.hypervisor_effective_capacity(h, policies or ())
    alloc = h.status.allocation
    row = [
        h.name,
        readiness(h, now, lease_live, staleness).state,
        _used_of(CPU, alloc.get(CPU), eff.get(CPU)),
        _used_of(MEMORY, alloc.get(MEMORY), eff.get(MEMORY)),
        str(len(h.status.instances)),
        h.spec.maintenance or "-",
        spec_sync(h, policies).state,
        age(h.metadata.creation_timestamp, now),
    ]
    if wide:
        row += [
            _pairs(resolve_overcommit(h, policies or ()), lambda _r, x: ratio_text(x.value, x.source)),
            _pairs(h.spec.reserved, human),
            _pairs(h.metadata.labels, lambda _k, v: v),
        ]
    return row


# The column that says whether an object can be trusted, per kind.
STATE_COLUMNS = frozenset({"READY", "PHASE", "LIVE"})


def unknown_row(columns: Sequence[Column], name: str) -> list[str]:
    """The row of an object that cannot be read (it does not decode): its name,
    `Unknown` in the kind's state column, nothing else."""
    return [name if c.format == "name" else "Unknown" if c.name in STATE_COLUMNS else "-"
            for c in columns]


def ratio_text(value: float, source: str) -> str:
    """`4`, or `4(compute-default)` when OvercommitPolicy compute-default gives it."""
    return f"{value:g}" if source == SPEC else f"{value:g}({source.removeprefix('OvercommitPolicy/')})"


# -- overcommit policies (`get overcommitpolicies`) ------------------------------------------

_POLICY_COLUMNS = (
    Column("NAME", format="name"),
    Column("PRIORITY", "integer", "spec.priority: the higher wins where policies overlap"),
    Column("SELECTOR", description="spec.selector ((all): every hypervisor)"),
    Column("OVERCOMMIT", description="spec.overcommit"),
    Column("HYPERVISORS", "integer", "hypervisors the selector matches"),
    Column("AGE", description="since metadata.creationTimestamp"),
)


def policy_columns(wide: bool = False) -> list[Column]:
    return _visible(_POLICY_COLUMNS, wide)


def policy_row(
    p: OvercommitPolicy, hosts: Iterable[Hypervisor], now: datetime, wide: bool = False
) -> list[str]:
    """The cells of `policy_columns(wide)`; `hosts` are counted by the selector."""
    sel = p.spec.selector.to_selector()
    return [
        p.name,
        str(p.spec.priority),
        str(sel) or "(all)",
        _pairs(p.spec.overcommit, lambda _r, v: f"{v:g}"),
        str(sum(1 for h in hosts if sel.matches(h.metadata.labels))),
        age(p.metadata.creation_timestamp, now),
    ]


# -- reservations (`get reservations`) -----------------------------------------------------

_RESERVATION_COLUMNS = (
    Column("NAME", format="name"),
    Column("HYPERVISOR", description="spec.hypervisor"),
    Column("CONSUMER", description="spec.consumer"),
    Column("RESOURCES", description="spec.resources"),
    Column("PHASE", description="phase derived now (Confirmed once the instance runs, Expired, ...)"),
    Column("HOLDS", description="what it holds now (a running instance's VGPU, VFs, ...)"),
    Column("EXPIRES", description="spec.expiresAt"),
    Column("AGE", description="since metadata.creationTimestamp"),
    Column("SOURCE", description="spec.source: hvfleet, or a mirrored Placement allocation", priority=1),
)


def reservation_columns(wide: bool = False) -> list[Column]:
    return _visible(_RESERVATION_COLUMNS, wide)


def reservation_row(r: Reservation, h: Hypervisor | None, now: datetime, wide: bool = False) -> list[str]:
    """The cells of `reservation_columns(wide)`; `h` is the reservation's host
    (None when it is not known), from which phase and holdings are derived."""
    row = [
        r.name,
        r.spec.hypervisor,
        r.spec.consumer,
        _pairs(r.spec.resources, human),
        cap.reservation_phase(r, h, now),
        _pairs(cap.held_resources(r, h, now), human),
        r.spec.expires_at.isoformat() if r.spec.expires_at else "-",
        age(r.metadata.creation_timestamp, now),
    ]
    if wide:
        row.append(r.spec.source)
    return row


# -- agent leases (`get leases`) ------------------------------------------------------------------

_LEASE_COLUMNS = (
    Column("NAME", description="metadata.name: the hypervisor", format="name"),
    Column("HOLDER", description="spec.holderIdentity (- once released)"),
    Column("LIVE", "boolean", "held, and renewed less than leaseDurationSeconds ago"),
    Column("RENEWED", description="time since spec.renewTime"),
    Column("DURATION", "integer", "spec.leaseDurationSeconds"),
    Column("AGE", description="time since metadata.creationTimestamp"),
)


def lease_columns(wide: bool = False) -> list[Column]:
    return _visible(_LEASE_COLUMNS, wide)


def lease_row(lease: Lease, now: datetime, wide: bool = False) -> list[str]:
    """The cells of `lease_columns(wide)`."""
    return [
        lease.name,
        lease.spec.holder_identity or "-",
        str(lease_live(lease, now)),
        age(lease.spec.renew_time, now),
        f"{lease.spec.lease_duration_seconds}s",
        age(lease.metadata.creation_timestamp, now),
    ]


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
        out.update(effective=_strs(self.effective), allocation=_strs(self.allocation), free=_strs(self.free))
        return out


@dataclass(frozen=True)
class FleetCapacity:
    hosts: list[HostCapacity]
    total: HostCapacity

    @property
    def resources(self) -> list[ResourceName]:
        """Every resource any host has effective capacity of; cpu and memory first."""
        found = {r for x in self.hosts for r in x.effective} | {CPU, MEMORY}
        return sorted(found, key=lambda r: (r not in (CPU, MEMORY), str(r)))

    def to_dict(self) -> dict[str, Any]:
        total = self.total.to_dict()
        del total["name"]
        return {"hosts": [x.to_dict() for x in self.hosts], "total": total}


def host_capacity(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    now: datetime,
    lease_live: bool | None = None,
    staleness: timedelta = DEFAULT_STALENESS,
    policies: Sequence[OvercommitPolicy] | None = None,
) -> HostCapacity:
    return HostCapacity(
        name=h.name,
        readiness=readiness(h, now, lease_live, staleness),
        effective=cap.hypervisor_effective_capacity(h, policies or ()),
        allocation=dict(h.status.allocation),
        free=cap.free_capacity(h, reservations, now, policies or ()),
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
    total = HostCapacity(
        name="TOTAL",
        readiness=None,
        effective=cap.add(x.effective for x in rows),
        allocation=cap.add(x.allocation for x in rows),
        free=cap.add(x.free for x in rows),
    )
    return FleetCapacity(rows, total)


def fleet_capacity(
    hosts: Iterable[Hypervisor],
    reservations: Iterable[Reservation],
    liveness: Mapping[str, bool],
    now: datetime,
    staleness: timedelta = DEFAULT_STALENESS,
    policies: Sequence[OvercommitPolicy] | None = None,
) -> dict[str, Any]:
    """The `capacity -o json` document: `{"hosts": [...], "total": {...}}`."""
    return fleet_summary(hosts, reservations, liveness, now, staleness, policies).to_dict()


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
            x.readiness.state if x.readiness is not None else "",
            x.synced.state if x.synced is not None else "",
        ]
        levels: list[FreeLevel] = ["ok", "ok", "ok"]
        for r in rs:
            cells.append(_used_of(r, x.allocation.get(r), x.effective.get(r)))
            levels.append("ok")
        for r in rs:
            level = free_level(x.free.get(r), x.effective.get(r))
            text = human(r, x.free.get(r))
            cells.append(f"{text} (overcommitted)" if level == "overcommitted" else text)
            levels.append(level)
        out.append(CapacityRow(cells, levels, total=x is summary.total))
    return out
