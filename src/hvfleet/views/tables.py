"""Table columns and rows per kind: what `hvfleet get`, the API's meta.k8s.io
Table (kubectl) and the dashboard show of each object, in one place.

`TABLES` holds one `KindTable` per public kind, keyed like the strategies of
`hvfleet.model.kinds`: its columns, its rows, what the rows need besides the
objects (`TableInputs`: agents' liveness, policies, hosts), and how an empty
list is said. `table_inputs(kind, fleet)` reads those from anything shaped
like a Store (`FleetReader`), so the CLI and the server fill them alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from hvfleet.model import capacity as cap
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Reservation, Resource
from hvfleet.model.lease import Lease, lease_live
from hvfleet.model.overcommit import resolve_overcommit
from hvfleet.model.readiness import DEFAULT_STALENESS, readiness
from hvfleet.model.resources import CPU, MEMORY
from hvfleet.model.spec_sync import spec_sync
from hvfleet.views.text import (
    Column,
    age,
    human,
    pairs,
    ratio_text,
    used_of,
    visible,
)

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
    return visible(_HYPERVISOR_COLUMNS, wide)


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
        used_of(CPU, alloc.get(CPU), eff.get(CPU)),
        used_of(MEMORY, alloc.get(MEMORY), eff.get(MEMORY)),
        str(len(h.status.instances)),
        h.spec.maintenance or "-",
        spec_sync(h, policies).state,
        age(h.metadata.creation_timestamp, now),
    ]
    if wide:
        row += [
            pairs(resolve_overcommit(h, policies or ()), lambda _r, x: ratio_text(x.value, x.source)),
            pairs(h.spec.reserved, human),
            pairs(h.metadata.labels, lambda _k, v: v),
        ]
    return row



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
    return visible(_POLICY_COLUMNS, wide)


def policy_row(
    p: OvercommitPolicy, hosts: Iterable[Hypervisor], now: datetime, wide: bool = False
) -> list[str]:
    """The cells of `policy_columns(wide)`; `hosts` are counted by the selector."""
    sel = p.spec.selector.to_selector()
    return [
        p.name,
        str(p.spec.priority),
        str(sel) or "(all)",
        pairs(p.spec.overcommit, lambda _r, v: f"{v:g}"),
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
    return visible(_RESERVATION_COLUMNS, wide)


def reservation_row(r: Reservation, h: Hypervisor | None, now: datetime, wide: bool = False) -> list[str]:
    """The cells of `reservation_columns(wide)`; `h` is the reservation's host
    (None when it is not known), from which phase and holdings are derived."""
    row = [
        r.name,
        r.spec.hypervisor,
        r.spec.consumer,
        pairs(r.spec.resources, human),
        cap.reservation_phase(r, h, now),
        pairs(cap.held_resources(r, h, now), human),
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
    return visible(_LEASE_COLUMNS, wide)


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


# -- one table per kind ----------------------------------------------------------------------


@dataclass(frozen=True)
class TableInputs:
    """What rows need besides the objects: each agent's liveness lease and the
    fleet's overcommit policies (hypervisor rows), and the hosts (reservation
    rows derive phase and holdings from them; policy rows count them)."""

    liveness: Mapping[str, bool] = field(default_factory=dict)
    hosts: Mapping[str, Hypervisor] = field(default_factory=dict)
    policies: Sequence[OvercommitPolicy] = ()


class FleetReader(Protocol):
    """What `table_inputs` reads: the typed reads every Store has."""

    def agent_liveness(self, now: datetime | None = None) -> dict[str, bool]: ...

    def list_hypervisors(self) -> list[Hypervisor]: ...

    def list_overcommit_policies(self) -> list[OvercommitPolicy]: ...


Rows = Callable[[Sequence[Resource], TableInputs, datetime, bool], list[list[str]]]


@dataclass(frozen=True)
class KindTable:
    """The table of one kind: `columns(wide)`, `rows(objs, inputs, now, wide)`
    (one row per object, in order), and what the rows need."""

    columns: Callable[[bool], list[Column]]
    rows: Rows
    # The objects' plural as a sentence says it ("No overcommit policies found.").
    said: str
    needs_liveness: bool = False
    needs_policies: bool = False
    needs_hosts: bool = False

    def empty(self) -> str:
        return f"No {self.said} found."


T = TypeVar("T")


def _typed(objs: Sequence[Resource], model: type[T]) -> list[T]:
    return [o for o in objs if isinstance(o, model)]


TABLES: dict[str, KindTable] = {
    "Hypervisor": KindTable(
        hypervisor_columns,
        lambda objs, i, now, wide: [
            hypervisor_row(o, now, i.liveness.get(o.name), wide, policies=i.policies)
            for o in _typed(objs, Hypervisor)],
        "hypervisors", needs_liveness=True, needs_policies=True,
    ),
    "Reservation": KindTable(
        reservation_columns,
        lambda objs, i, now, wide: [
            reservation_row(o, i.hosts.get(o.spec.hypervisor), now, wide)
            for o in _typed(objs, Reservation)],
        "reservations", needs_hosts=True,
    ),
    "Lease": KindTable(
        lease_columns,
        lambda objs, _i, now, wide: [lease_row(o, now, wide) for o in _typed(objs, Lease)],
        "leases",
    ),
    "OvercommitPolicy": KindTable(
        policy_columns,
        lambda objs, i, now, wide: [
            policy_row(o, i.hosts.values(), now, wide) for o in _typed(objs, OvercommitPolicy)],
        "overcommit policies", needs_hosts=True,
    ),
}


def table_inputs(kind: str, fleet: FleetReader) -> TableInputs:
    """What the rows of `kind` need, read from `fleet` (a Store)."""
    t = TABLES[kind]
    return TableInputs(
        liveness=fleet.agent_liveness() if t.needs_liveness else {},
        hosts={h.name: h for h in fleet.list_hypervisors()} if t.needs_hosts else {},
        policies=fleet.list_overcommit_policies() if t.needs_policies else (),
    )


def rows_for(kind: str, objs: Sequence[Resource], inputs: TableInputs, now: datetime,
             wide: bool = False) -> tuple[list[Column], list[list[str]]]:
    """The columns of `kind` and one row per object."""
    t = TABLES[kind]
    return t.columns(wide), t.rows(objs, inputs, now, wide)

