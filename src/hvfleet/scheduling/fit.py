"""Whether a request fits on a host, and if not, why: the pure reference.

A host is a candidate when `hvfleet.model.readiness.readiness` calls it Ready
(its agent's liveness lease has not expired where the store has leases, its
`Ready` condition is True, its last heartbeat is fresh, it is not in
maintenance) and its scheduling annotations parse. A candidate fits when, for every
requested resource, `count × request <= free` (free from
`hvfleet.model.capacity.free_capacity`: effective − allocation − space held
by reservations), `request <= max_unit` (capacity + extra − reserved: overcommit
makes room for more guests, not bigger ones) and, where the host declares them,
`request >= min_unit` and `request % step_size == 0` — Placement's inventory
constraints. The fleet index answers the same question vectorised; this module
is what it is tested against, what `--why` explains with, and what a claim
re-checks inside the store's atomic write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any, Literal

from hvfleet.model.capacity import free_capacity, max_unit
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor, OvercommitPolicy, Reservation
from hvfleet.model.quantity import Quantity
from hvfleet.model.readable import human
from hvfleet.model.readiness import (
    AGENT_LEASE_EXPIRED,
    DEFAULT_STALENESS,
    Readiness,
    ReadinessState,
    readiness,
)
from hvfleet.model.resources import ResourceName
from hvfleet.model.units import unit_constraints
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.request import Request

Reason = Literal[
    "maintenance",
    "not-ready",
    "stale",
    "invalid-annotation",
    "agent-lease-expired",
    "insufficient",
    "max-unit",
    "min-unit",
    "step-size",
]


@dataclass(frozen=True)
class Rejection:
    reason: Reason
    message: str
    resource: ResourceName | None = None
    requested: Quantity | None = None
    available: Quantity | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason, "message": self.message}
        # Amounts in the resource's exact form (bytes in binary units), as every answer shows them.
        shown = self.resource.quantity if self.resource is not None else Quantity
        if self.resource is not None:
            out["resource"] = str(self.resource)
        if self.requested is not None:
            out["requested"] = str(shown(self.requested))
        if self.available is not None:
            out["available"] = str(shown(self.available))
        if self.reason == "insufficient" and self.requested is not None and self.available is not None:
            out["shortBy"] = str(shown(self.requested - self.available))
        return out


_REJECTION_OF_STATE: dict[ReadinessState, Reason] = {
    "NotReady": "not-ready",
    "Unknown": "not-ready",
    "Stale": "stale",
    "Maintenance": "maintenance",
}


def readiness_rejection(r: Readiness) -> Rejection | None:
    """A readiness that is not Ready, as the reason `--why` gives."""
    if r.ready:
        return None
    reason = "agent-lease-expired" if r.reason == AGENT_LEASE_EXPIRED else _REJECTION_OF_STATE[r.state]
    return Rejection(reason, r.message)


def candidacy(
    h: Hypervisor, now: datetime, staleness: timedelta = DEFAULT_STALENESS, live: bool | None = None
) -> Rejection | None:
    """Why the host is not a scheduling candidate at all, or None. `live` is
    what the store says of the agent's liveness lease (None: no information)."""
    not_ready = readiness_rejection(readiness(h, now, live, staleness))
    if not_ready is not None:
        return not_ready
    try:
        unit_constraints(h)
    except InvalidInput as exc:
        # One host's typo must not break every fit query: that host is out.
        return Rejection("invalid-annotation", str(exc))
    return None


def _divides(step: Fraction, amount: Fraction) -> bool:
    return (amount / step).denominator == 1


def _shown(r: ResourceName, amount: Quantity) -> str:
    """An amount of `r` as a person reads it (memory in binary units)."""
    return human(r, r.quantity(amount))


def resource_rejections(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    request: Request,
    now: datetime | None,
    policies: Sequence[OvercommitPolicy] = (),
    holds: Mapping[ResourceName, Quantity] | None = None,
) -> list[Rejection]:
    """Per requested resource, what does not hold (empty: the request fits).
    `holds` is what a claim of the request would hold on `h` where that is
    less than the request (`claim_holds`: its consumer's instance is already
    there and libvirt's allocation counts part of it): what must be free; the unit
    constraints still judge the request."""
    free = free_capacity(h, reservations, now, policies)
    largest = max_unit(h)
    units = unit_constraints(h)
    out: list[Rejection] = []
    for r in sorted(request.resources, key=str):
        one = request.resources[r]
        need = request.total(r) if holds is None else holds.get(r, Quantity(0, one.format))
        have = free.get(r, Quantity(0, one.format))
        if need > have:
            out.append(Rejection("insufficient", f"{r}: needs {_shown(r, need)}, {_shown(r, have)} free "
                                 f"(short by {_shown(r, need - have)})", r, need, have))
        biggest = largest.get(r, Quantity(0, one.format))
        if one > biggest:
            out.append(Rejection("max-unit", f"{r}: one instance needs {_shown(r, one)}, more than the "
                                 f"host's {_shown(r, biggest)} after its reserve", r, one, biggest))
        c = units.get(r)
        if c is not None and c.min_unit is not None and one < c.min_unit:
            out.append(
                Rejection("min-unit", f"{r}: {one} is below min_unit {c.min_unit}", r, one, c.min_unit)
            )
        if c is not None and c.step_size is not None and not _divides(c.step_size.value, one.value):
            out.append(Rejection("step-size", f"{r}: {one} is not a multiple of step_size {c.step_size}",
                                 r, one, c.step_size))
    return out


def rejections(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    request: Request,
    now: datetime,
    staleness: timedelta = DEFAULT_STALENESS,
    live: bool | None = None,
    policies: Sequence[OvercommitPolicy] = (),
    holds: Mapping[ResourceName, Quantity] | None = None,
) -> list[Rejection]:
    """Everything that keeps `request` off `h`; empty when it fits (`holds`:
    as for `resource_rejections`)."""
    not_candidate = candidacy(h, now, staleness, live)
    if not_candidate is not None:
        return [not_candidate]
    return resource_rejections(h, reservations, request, now, policies, holds)


def check_claim(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    request: Request,
    now: datetime,
    staleness: timedelta = DEFAULT_STALENESS,
    policies: Sequence[OvercommitPolicy] = (),
    live: bool | None = None,
    holds: Mapping[ResourceName, Quantity] | None = None,
) -> None:
    """Raise DoesNotFit unless `request` fits on `h` right now. `live` is what
    the host's agent Lease says (None: the host has none), as for `rejections`;
    `holds` what the claim would hold, as for `resource_rejections`."""
    found = rejections(h, reservations, request, now, staleness, live, policies, holds)
    if found:
        raise DoesNotFit(h.name, found)


def reservations_by_host(reservations: Iterable[Reservation]) -> dict[str, list[Reservation]]:
    out: dict[str, list[Reservation]] = {}
    for r in reservations:
        out.setdefault(r.spec.hypervisor, []).append(r)
    return out


def fitting_hosts(
    hosts: Iterable[Hypervisor],
    reservations: Mapping[str, list[Reservation]],
    request: Request,
    now: datetime,
    staleness: timedelta = DEFAULT_STALENESS,
    liveness: Mapping[str, bool] | None = None,
    policies: Sequence[OvercommitPolicy] = (),
) -> list[str]:
    """Names of hosts `request` fits on, sorted (the unvectorised reference).
    `liveness` is `Store.agent_liveness()`: hosts it lists as False are out."""
    live = liveness or {}
    return sorted(
        h.name
        for h in hosts
        if not rejections(
            h, reservations.get(h.name, []), request, now, staleness, live.get(h.name), policies
        )
    )
