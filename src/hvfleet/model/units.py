"""Placement's per-inventory unit constraints of a host, which libvirt knows
nothing of, declared as Hypervisor annotations:
`scheduling.hvfleet.io/min-unit.cpu: "2"`, `scheduling.hvfleet.io/step-size.memory: "1Gi"`.

One parse for every reader (`fit`, the fleet index, `placement export`, the
Placement API's root providers) and for the write that stores them: a create
or an annotation change of a Hypervisor is refused (422, exit 2) unless each
parses, is greater than 0 and is a whole number of the resource's Placement
units (a step of 0.5 cpu is no VCPU step: `fit` and Placement would judge
requests differently). A value stored before this check is still read: its
readers take the host out of scheduling, as `fit` does, and say why."""

from __future__ import annotations

from dataclasses import dataclass

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName

MIN_UNIT_PREFIX = "scheduling.hvfleet.io/min-unit."
STEP_SIZE_PREFIX = "scheduling.hvfleet.io/step-size."


@dataclass(frozen=True)
class UnitConstraint:
    min_unit: Quantity | None = None
    step_size: Quantity | None = None


def _constraint(h: Hypervisor, key: str, value: str, prefix: str) -> tuple[ResourceName, Quantity]:
    where = f"metadata.annotations[{key}]"
    r = ResourceName.parse(key.removeprefix(prefix), where=where)
    q = Quantity.parse(value, where=where)
    if q <= 0:
        raise InvalidInput(f"hypervisor {h.name}: {value!r} must be greater than 0", field=where)
    base = r.placement.base_per_unit
    if (q.value / base).denominator != 1:
        raise InvalidInput(
            f"hypervisor {h.name}: {value!r} is not a whole number of Placement's "
            f"{r.placement.resource_class} units ({r.quantity(base)} each)", field=where)
    return r, q


def unit_constraints(h: Hypervisor) -> dict[ResourceName, UnitConstraint]:
    """min_unit / step_size per resource, from the host's annotations;
    InvalidInput naming the annotation that is not one."""
    mins: dict[ResourceName, Quantity] = {}
    steps: dict[ResourceName, Quantity] = {}
    for key, value in h.metadata.annotations.items():
        for prefix, target in ((MIN_UNIT_PREFIX, mins), (STEP_SIZE_PREFIX, steps)):
            if key.startswith(prefix):
                r, q = _constraint(h, key, value, prefix)
                target[r] = q
    return {r: UnitConstraint(mins.get(r), steps.get(r)) for r in sorted(set(mins) | set(steps), key=str)}


def check_unit_annotations(new: Hypervisor, old: Hypervisor | None = None) -> None:
    """The write-time check: on a create, or an update that changes the
    annotations (an agent's status write carries the stored ones unchanged)."""
    if old is None:
        unit_constraints(new)
        return
    if old.metadata.annotations == new.metadata.annotations:
        return
    # Only what this write gives anew: an annotation stored before the check,
    # left as it is, does not keep another one from being added.
    given = {k: v for k, v in new.metadata.annotations.items() if old.metadata.annotations.get(k) != v}
    unit_constraints(new.model_copy(update={"metadata": new.metadata.model_copy(
        update={"annotations": given})}))
