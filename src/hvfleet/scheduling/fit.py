"""Whether a request fits on a host, and if not, why: the pure reference.

A host is a candidate when it is not in maintenance, its agent's liveness
lease has not expired (where the store has leases: etcd), its `Ready`
condition is True and its last heartbeat is fresh. A candidate fits when, for every
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
from hvfleet.model.meta import find_condition
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.request import Request

# The node agent's default resync interval (hvfleet.agent.runner; scheduling may not
# import the agent); a host whose heartbeat is older than three
# of them is treated as gone (its numbers may be stale).
DEFAULT_RESYNC = timedelta(seconds=60)
DEFAULT_STALENESS = 3 * DEFAULT_RESYNC

# Placement's per-inventory constraints, declared on a Hypervisor as annotations
# because libvirt knows nothing of them: `scheduling.hvfleet.io/min-unit.cpu: "2"`.
MIN_UNIT_PREFIX = "scheduling.hvfleet.io/min-unit."
STEP_SIZE_PREFIX = "scheduling.hvfleet.io/step-size."

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
        if self.resource is not None:
            out["resource"] = str(self.resource)
        if self.requested is not None:
            out["requested"] = str(self.requested)
        if self.available is not None:
            out["available"] = str(self.available)
        if self.reason == "insufficient" and self.requested is not None and self.available is not None:
            out["shortBy"] = str(self.requested - self.available)
        return out


@dataclass(frozen=True)
class UnitConstraint:
    min_unit: Quantity | None = None
    step_size: Quantity | None = None


def unit_constraints(h: Hypervisor) -> dict[ResourceName, UnitConstraint]:
    """min_unit / step_size per resource, from the host's annotations."""
    mins: dict[ResourceName, Quantity] = {}
    steps: dict[ResourceName, Quantity] = {}
    for key, value in h.metadata.annotations.items():
        for prefix, target in ((MIN_UNIT_PREFIX, mins), (STEP_SIZE_PREFIX, steps)):
            if key.startswith(prefix):
                where = f"hypervisor {h.name}: annotation {key}"
                r = ResourceName.parse(key.removeprefix(prefix), where=where)
                q = Quantity.parse(value, where=where)
                if q <= 0:
                    raise InvalidInput(f"{where}: {value!r} must be greater than 0")
                target[r] = q
    return {r: UnitConstraint(mins.get(r), steps.get(r)) for r in sorted(set(mins) | set(steps), key=str)}


def candidacy(
    h: Hypervisor, now: datetime, staleness: timedelta = DEFAULT_STALENESS, live: bool | None = None
) -> Rejection | None:
    """Why the host is not a scheduling candidate at all, or None. `live` is
    what the store says of the agent's liveness lease (None: no information)."""
    if h.spec.maintenance:
        why = f" ({h.spec.maintenance_reason})" if h.spec.maintenance_reason else ""
        return Rejection("maintenance", f"in maintenance ({h.spec.maintenance}){why}")
    try:
        unit_constraints(h)
    except InvalidInput as exc:
        # One host's typo must not break every fit query: that host is out.
        return Rejection("invalid-annotation", str(exc))
    return health(h, now, staleness, live)


def health(
    h: Hypervisor, now: datetime, staleness: timedelta = DEFAULT_STALENESS, live: bool | None = None
) -> Rejection | None:
    if live is False:
        # Checked first: the stored status is the dead agent's last word, so a
        # Ready=True and a heartbeat younger than the staleness prove nothing.
        return Rejection(
            "agent-lease-expired", "the agent's liveness lease expired (its last status may be stale)"
        )
    ready = find_condition(h.status.conditions, "Ready")
    if ready is None or ready.status != "True":
        state = "missing" if ready is None else ready.status
        detail = f": {ready.reason}" if ready is not None and ready.reason else ""
        return Rejection("not-ready", f"Ready condition is {state}{detail}")
    beat = h.status.last_heartbeat_time
    if beat is None:
        return Rejection("stale", "no heartbeat recorded")
    if beat < now - staleness:
        age = int((now - beat).total_seconds())
        return Rejection("stale", f"last heartbeat {age}s ago, older than {int(staleness.total_seconds())}s")
    return None


def _divides(step: Fraction, amount: Fraction) -> bool:
    return (amount / step).denominator == 1


def resource_rejections(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    request: Request,
    now: datetime | None,
    policies: Sequence[OvercommitPolicy] = (),
) -> list[Rejection]:
    """Per requested resource, what does not hold (empty: the request fits)."""
    free = free_capacity(h, reservations, now, policies)
    largest = max_unit(h)
    units = unit_constraints(h)
    out: list[Rejection] = []
    for r in sorted(request.resources, key=str):
        one = request.resources[r]
        need = request.total(r)
        have = free.get(r, Quantity(0, one.format))
        if need > have:
            out.append(
                Rejection(
                    "insufficient",
                    f"{r}: needs {need}, {have} free (short by {need - have})",
                    r,
                    need,
                    have,
                )
            )
        biggest = largest.get(r, Quantity(0, one.format))
        if one > biggest:
            out.append(
                Rejection(
                    "max-unit",
                    f"{r}: one instance needs {one}, more than the host's {biggest} after its reserve",
                    r,
                    one,
                    biggest,
                )
            )
        c = units.get(r)
        if c is not None and c.min_unit is not None and one < c.min_unit:
            out.append(
                Rejection("min-unit", f"{r}: {one} is below min_unit {c.min_unit}", r, one, c.min_unit)
            )
        if c is not None and c.step_size is not None and not _divides(c.step_size.value, one.value):
            out.append(
                Rejection(
                    "step-size",
                    f"{r}: {one} is not a multiple of step_size {c.step_size}",
                    r,
                    one,
                    c.step_size,
                )
            )
    return out


def rejections(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    request: Request,
    now: datetime,
    staleness: timedelta = DEFAULT_STALENESS,
    live: bool | None = None,
    policies: Sequence[OvercommitPolicy] = (),
) -> list[Rejection]:
    """Everything that keeps `request` off `h`; empty when it fits."""
    not_candidate = candidacy(h, now, staleness, live)
    if not_candidate is not None:
        return [not_candidate]
    return resource_rejections(h, reservations, request, now, policies)


def check_claim(
    h: Hypervisor,
    reservations: Iterable[Reservation],
    request: Request,
    now: datetime,
    staleness: timedelta = DEFAULT_STALENESS,
    policies: Sequence[OvercommitPolicy] = (),
) -> None:
    """Raise DoesNotFit unless `request` fits on `h` right now."""
    found = rejections(h, reservations, request, now, staleness, policies=policies)
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
