"""The dashboard's JSON feed: one row per host and the fleet's totals, built only
from the core's own answers (`hvfleet.views.host_capacity`, readiness,
`hvfleet.model.capacity` for what reservations hold, raw capacity and ratios).
Nothing here computes a capacity: the figures are the core's strings, exactly as
`hvfleet capacity -o json` prints them, and the only arithmetic is the bars'
geometry (each figure's share of the bar, as a float for CSS widths).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from hvfleet.model import capacity as cap
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Reservation, ResourceList
from hvfleet.model.quantity import Quantity
from hvfleet.model.readiness import readiness
from hvfleet.model.resources import ResourceName
from hvfleet.views.capacity import (
    FleetTotals,
    HostCapacity,
    free_level,
    host_capacity,
    resource_order,
)
from hvfleet.views.text import human


@dataclass(frozen=True)
class HostRow:
    """One host as the overview shows it: the core's HostCapacity, what its
    reservations hold, its raw capacity and ratios, and the JSON document."""

    name: str
    labels: Mapping[str, str]
    capacity: HostCapacity
    held: ResourceList
    doc: dict[str, Any]
    version: str | None = None  # the host's resourceVersion the row was computed from


def _f(q: Quantity | None) -> float:
    return float(q.value) if q is not None else 0.0


def _bar(effective: Quantity | None, raw: Quantity | None, allocation: Quantity | None,
         held: Quantity | None, free: Quantity | None) -> dict[str, float]:
    """Shares of one bar (0..1) for the core's figures: the bar spans the largest
    of effective, raw and what is used, so a ratio below or above 1 shows as the
    raw mark left or right of the effective end."""
    e, r, a, h = _f(effective), _f(raw), _f(allocation), _f(held)
    scale = max(e, r, a + h, 1e-12)
    free_share = max(_f(free), 0.0)
    return {"allocation": a / scale, "held": h / scale, "free": free_share / scale,
            "effective": e / scale, "raw": r / scale}


def _use(effective: Quantity | None, free: Quantity | None) -> float | None:
    """Share of effective capacity in use (allocated or held), for the heat map."""
    e = _f(effective)
    if e <= 0:
        return None
    return 1.0 - _f(free) / e


def host_row(h: Hypervisor, reservations: Iterable[Reservation], now: datetime,
             lease_live: bool | None, policies: Sequence[OvercommitPolicy] = ()) -> HostRow:
    mine = [r for r in reservations if r.spec.hypervisor == h.name]
    hc = host_capacity(h, mine, now, lease_live, policies=list(policies))
    held = cap.add(cap.held_resources(r, h, now) for r in mine)
    raw = cap.usable_capacity(h.status.capacity, {}, h.spec.extra_capacity)
    ratios = cap.overcommit_ratios(h, policies)
    doc = hc.to_dict()
    strs_eff, strs_alloc, strs_free = doc["effective"], doc["allocation"], doc["free"]
    resources: dict[str, Any] = {}
    for r in sorted(set(hc.effective) | set(hc.allocation), key=resource_order):
        eff, alloc, free = hc.effective.get(r), hc.allocation.get(r), hc.free.get(r)
        resources[str(r)] = {
            "effective": strs_eff.get(str(r)),
            "allocation": strs_alloc.get(str(r), "0"),
            "held": str(held[r]) if r in held else "0",
            "free": strs_free.get(str(r)),
            "raw": str(raw[r]) if r in raw else None,
            "ratio": ratios.get(r, 1.0),
            "level": free_level(free, eff),
            "text": {"effective": human(r, eff), "allocation": human(r, alloc or Quantity(0)),
                     "held": human(r, held.get(r, Quantity(0))), "free": human(r, free),
                     "raw": human(r, raw.get(r))},
            "bar": _bar(eff, raw.get(r), alloc, held.get(r), free),
            "use": _use(eff, free),
        }
    doc.update(labels=dict(h.metadata.labels), maintenance=h.spec.maintenance,
               instances=len(h.status.instances), resources=resources)
    return HostRow(h.name, dict(h.metadata.labels), hc, held, doc, h.metadata.resource_version)


def same_figures(a: HostRow | None, b: HostRow | None) -> bool:
    """Whether two rows of a host show the same figures (allocated, held by
    reservations, effective capacity): what its history records. Readiness
    and the other fields of the row are not figures."""
    if a is None or b is None:
        return a is b
    return (a.capacity.allocation == b.capacity.allocation and a.capacity.effective == b.capacity.effective
            and a.held == b.held)


def shown_alike(a: HostRow, b: HostRow) -> bool:
    """Whether two rows of a host show the same, but for the readiness
    message: a stale host's says how old its heartbeat is, which moves with
    the clock alone and is no change to send to every page (the state, its
    reason and every figure are)."""
    if a is b or a.doc == b.doc:
        return True
    ra, rb = a.doc.get("readiness"), b.doc.get("readiness")
    if not isinstance(ra, dict) or not isinstance(rb, dict):
        return False
    return ({**ra, "message": ""} == {**rb, "message": ""}
            and {**a.doc, "readiness": None} == {**b.doc, "readiness": None})


def with_readiness(row: HostRow, h: Hypervisor, now: datetime, lease_live: bool | None) -> HostRow:
    """`row` with the host's readiness judged again at `now` (the core's
    `readiness`); its figures stand while the host and its reservations have not
    changed, since only readiness moves with the clock alone."""
    judged = readiness(h, now, lease_live)
    if row.capacity.readiness == judged:
        return row
    doc = {**row.doc, "ready": judged.ready, "readiness": judged.to_dict()}
    return replace(row, capacity=replace(row.capacity, readiness=judged), doc=doc)


def totals_document(sums: FleetTotals) -> dict[str, Any]:
    """The dashboard's totals: the figures of `sums` (hvfleet.views.FleetTotals),
    with their text and bar geometry, and the states' counts."""
    resources = {}
    for r in sums.resources():
        eff, alloc, fr = sums.effective.get(r), sums.allocation.get(r), sums.free.get(r)
        held = sums.held.get(r, Quantity(0))
        resources[str(r)] = {
            "effective": str(eff) if eff is not None else None,
            "allocation": str(alloc) if alloc is not None else "0",
            "held": str(held) if r in sums.held else "0",
            "free": str(fr) if fr is not None else None,
            "text": {"effective": human(r, eff), "allocation": human(r, alloc or Quantity(0)),
                     "held": human(r, held), "free": human(r, fr)},
            "bar": _bar(eff, None, alloc, held, fr),
            "level": free_level(fr, eff),
        }
    return {"hosts": sums.hosts, "states": dict(sorted(sums.states.items())), "resources": resources}


def totals_of(rows: Iterable[HostRow]) -> FleetTotals:
    """The totals of `rows`, added up (hvfleet.views.FleetTotals)."""
    sums = FleetTotals()
    for x in rows:
        sums.add(x.capacity, x.held)
    return sums


def sort_rows(rows: list[HostRow], key: str) -> list[HostRow]:
    """`name`, `free:RESOURCE` (most free first) or `used:RESOURCE` (most used
    first), by the core's free and allocation figures; ties by name."""
    how, _, resource = key.partition(":")
    if how not in ("free", "used") or not resource:
        return sorted(rows, key=lambda x: x.name)
    r = ResourceName.parse(resource, where="sort")

    def value(x: HostRow) -> float:
        q = (x.capacity.free if how == "free" else x.capacity.allocation).get(r)
        return -_f(q) if q is not None else float("inf")

    return sorted(rows, key=lambda x: (value(x), x.name))
