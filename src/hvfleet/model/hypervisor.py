"""The Hypervisor, Reservation and OvercommitPolicy resources.

`spec` is what someone wants (overcommit ratios, host reserve, capacity libvirt
cannot see, maintenance); `status` is what the node agent observed. The split
follows the seed discussion: a scheduler writes `spec.overcommit`, the agent
confirms it in `status.effectiveCapacity`, and nobody but the agent of that
host writes `status`. An OvercommitPolicy gives ratios to every hypervisor its
label selector matches, for the resources a host's own `spec.overcommit` says
nothing about (precedence in `hvfleet.model.overcommit`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field, PlainSerializer, field_validator, model_validator

from hvfleet.model.bounds import (
    MAX_CELLS,
    MAX_CONDITIONS,
    MAX_INSTANCE_NAME,
    MAX_INSTANCES,
    MAX_LIST,
    MAX_NAME,
    MAX_RATIO,
    MAX_RESOURCES,
    MAX_SELECTOR_TERMS,
    MIN_RATIO,
    Amount,
    Count,
    EffectiveAmount,
    Int64,
    Ratio,
    Timestamp,
)
from hvfleet.model.dashboard import HistorySeries
from hvfleet.model.hostcaps import HostCapabilities
from hvfleet.model.lease import Lease
from hvfleet.model.meta import (
    Condition,
    Model,
    StoredObject,
    label_value_error,
    qualified_name_error,
    valid_each,
    valid_labels,
    validate_name,
)
from hvfleet.model.placement import PlacementConsumer, PlacementName, ResourceProvider
from hvfleet.model.resources import ResourceName
from hvfleet.model.selectors import Requirement, Selector
from hvfleet.model.token import AccessToken

# A map of amounts per resource, as callers set them (hvfleet.model.bounds).
ResourceList = Annotated[dict[ResourceName, Amount], Field(max_length=MAX_RESOURCES)]
# Effective capacity: computed from a ResourceList and overcommit ratios.
EffectiveList = Annotated[dict[ResourceName, EffectiveAmount], Field(max_length=MAX_RESOURCES)]


def check_ratio(resource: str, value: Any) -> float:
    """An overcommit ratio: a finite number from MIN_RATIO to MAX_RATIO (below 1
    keeps part free)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"overcommit.{resource}: {str(value)[:40]!r} is not a number")
    try:
        ratio = float(value)
    except OverflowError:  # an integer of hundreds of digits
        ratio = math.inf
    if not math.isfinite(ratio):
        raise ValueError(f"overcommit.{resource}: {str(value)[:40]} is not finite")
    if ratio <= 0:
        raise ValueError(f"overcommit.{resource}: {value!r} must be greater than 0")
    if not MIN_RATIO <= ratio <= MAX_RATIO:
        raise ValueError(
            f"overcommit.{resource}: {value!r} is out of range ({MIN_RATIO} to {MAX_RATIO:g})"
        )
    return ratio


def _check_ratios(v: Any) -> Any:
    if isinstance(v, dict):
        if len(v) > MAX_RESOURCES:
            raise ValueError(f"at most {MAX_RESOURCES} ratios")
        return {k: check_ratio(str(k)[:MAX_NAME], r) for k, r in v.items()}
    return v


def _whole_as_integer(value: float) -> int | float:
    # As Go's encoding/json (so kube-apiserver) writes a float64: 4.0 is `4` on
    # the wire, and large values keep their exponent form. (A model_copy can
    # carry an int here: it skips validation.)
    number = float(value)
    return int(number) if number.is_integer() and abs(number) < 1e21 else number


# An overcommit ratio (bounded, hvfleet.model.bounds): a float in Python, an
# integer in JSON when it is whole.
OvercommitRatio = Annotated[Ratio, PlainSerializer(_whole_as_integer, when_used="json")]


def _non_negative(field: str, values: ResourceList) -> ResourceList:
    for name, q in values.items():
        if q < 0:
            raise ValueError(f"{field}.{name}: {q} must not be negative")
    return values


class HypervisorSpec(Model):
    overcommit: dict[ResourceName, OvercommitRatio] = Field(default_factory=dict,
                                                            max_length=MAX_RESOURCES)
    reserved: ResourceList = Field(default_factory=dict)
    extra_capacity: ResourceList = Field(default_factory=dict)
    maintenance: Literal["", "manual", "drain"] = ""
    maintenance_reason: str = Field(default="", max_length=1024)

    @field_validator("overcommit", mode="before")
    @classmethod
    def _ratios(cls, v: Any) -> Any:
        return _check_ratios(v)

    @field_validator("reserved")
    @classmethod
    def _reserved(cls, v: ResourceList) -> ResourceList:
        return _non_negative("reserved", v)

    @field_validator("extra_capacity")
    @classmethod
    def _extra(cls, v: ResourceList) -> ResourceList:
        return _non_negative("extraCapacity", v)

    @model_validator(mode="after")
    def _maintenance_reason(self) -> HypervisorSpec:
        if self.maintenance == "manual" and not self.maintenance_reason.strip():
            raise ValueError("maintenanceReason is required when maintenance is 'manual'")
        return self


class Cell(Model):
    id: Int64
    capacity: ResourceList = Field(default_factory=dict)
    allocation: ResourceList = Field(default_factory=dict)
    effective_capacity: EffectiveList = Field(default_factory=dict)


class Instance(Model):
    uuid: str = Field(max_length=MAX_NAME)
    # A domain name as libvirt has it (libvirt sets no limit of its own; the
    # agent cuts a longer one: agent.reconcile.instance_name).
    name: str = Field(max_length=MAX_INSTANCE_NAME)
    state: str = Field(max_length=MAX_NAME)
    resources: ResourceList = Field(default_factory=dict)
    # Guest crashes the node agent saw (libvirt's lifecycle event CRASHED, which
    # pvpanic and the Hyper-V crash MSRs raise), counted for as long as the
    # instance is listed. Absent until the first crash, so documents written
    # before these fields existed, and instances that never crashed, read the same.
    crash_count: Count | None = None
    last_crash_time: Timestamp | None = None
    # "panicked" (pvpanic, Hyper-V) or "crashloaded"
    last_crash_reason: str | None = Field(default=None, max_length=MAX_NAME)


# What the node agent counts in `status.allocation` (`hvfleet agent --count`):
# every defined domain, or only active ones (shut-off and crashed left out).
CountMode = Literal["defined", "running"]
COUNT_MODES: tuple[CountMode, ...] = ("defined", "running")


class HypervisorStatus(Model):
    capacity: ResourceList = Field(default_factory=dict)
    allocation: ResourceList = Field(default_factory=dict)
    # Which domains `allocation` counts. Absent in statuses written before the
    # agent recorded it: then only an active instance is known to be counted
    # (`model.capacity.counted_in_allocation`), so a claim never holds too little.
    count_mode: CountMode | None = None
    effective_capacity: EffectiveList = Field(default_factory=dict)
    cells: list[Cell] = Field(default_factory=list, max_length=MAX_CELLS)
    instances: list[Instance] = Field(default_factory=list, max_length=MAX_INSTANCES)
    host_capabilities: HostCapabilities | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=MAX_CONDITIONS)
    observed_generation: Count | None = None
    last_heartbeat_time: Timestamp | None = None


class Hypervisor(StoredObject):
    kind: Literal["Hypervisor"] = "Hypervisor"
    spec: HypervisorSpec = Field(default_factory=HypervisorSpec)
    status: HypervisorStatus = Field(default_factory=HypervisorStatus)


ReservationPhase = Literal["Pending", "Active", "Confirmed", "Released", "Expired"]
# Phases in which a reservation still holds space on its host.
HOLDING_PHASES: frozenset[str] = frozenset({"Pending", "Active"})


class ReservationSpec(Model):
    hypervisor: str
    resources: ResourceList
    consumer: str
    expires_at: Timestamp | None = None
    # Who promised the space: hvfleet itself, or a Placement allocation mirrored here.
    source: Literal["hvfleet", "placement"] = "hvfleet"

    @field_validator("resources")
    @classmethod
    def _positive(cls, v: ResourceList) -> ResourceList:
        if not v:
            raise ValueError("a reservation must reserve at least one resource")
        for name, q in v.items():
            if q <= 0:
                raise ValueError(f"resources.{name}: {q} must be greater than 0")
        return v

    @field_validator("consumer")
    @classmethod
    def _consumer(cls, v: str) -> str:
        if not v.strip() or len(v) > 255:
            raise ValueError("consumer must be a non-empty id of at most 255 characters")
        return v

    @field_validator("hypervisor")
    @classmethod
    def _hypervisor(cls, v: str) -> str:
        return validate_name(v, "spec.hypervisor")


class ReservationStatus(Model):
    phase: ReservationPhase = "Pending"
    message: str = ""


class Reservation(StoredObject):
    kind: Literal["Reservation"] = "Reservation"
    spec: ReservationSpec
    status: ReservationStatus = Field(default_factory=ReservationStatus)


class LabelSelectorRequirement(Model):
    """One `matchExpressions` entry, as in Kubernetes' LabelSelector."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list, max_length=MAX_LIST)

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        why = qualified_name_error(v)
        if why is not None:
            raise ValueError(f"key {why}")
        return v

    @field_validator("values")
    @classmethod
    def _label_values(cls, v: list[str]) -> list[str]:
        return valid_each(v, label_value_error)

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"{self.key}: operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"{self.key}: operator {self.operator} takes no values")
        return self


_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}


class LabelSelector(Model):
    """Kubernetes' LabelSelector: every matchLabels pair and every expression
    must hold. An empty selector matches every hypervisor."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_SELECTOR_TERMS)
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=MAX_SELECTOR_TERMS
    )

    @field_validator("match_labels")
    @classmethod
    def _match_labels(cls, v: dict[str, str]) -> dict[str, str]:
        return valid_labels(v, "key {why}", "{key}: {why}")

    def to_selector(self) -> Selector:
        reqs = [Requirement(k, "=", (v,)) for k, v in sorted(self.match_labels.items())]
        reqs += [
            Requirement(e.key, _OPS[e.operator], tuple(e.values))  # type: ignore[arg-type]
            for e in self.match_expressions
        ]
        return Selector(tuple(reqs))


class OvercommitPolicySpec(Model):
    selector: LabelSelector = Field(default_factory=LabelSelector)
    overcommit: dict[ResourceName, OvercommitRatio] = Field(max_length=MAX_RESOURCES)
    # Higher wins where two matching policies give a ratio for the same resource;
    # at equal priority the policy whose name sorts first.
    priority: int = Field(default=0, ge=-(2**31), le=2**31 - 1)

    @field_validator("overcommit", mode="before")
    @classmethod
    def _ratios(cls, v: Any) -> Any:
        if isinstance(v, dict) and not v:
            raise ValueError("a policy must give at least one ratio")
        return _check_ratios(v)


class OvercommitPolicyStatus(Model):
    """Nothing is observed about a policy; the resource has a status so that it
    is shaped like the others (a CRD with a status subresource)."""


class OvercommitPolicy(StoredObject):
    kind: Literal["OvercommitPolicy"] = "OvercommitPolicy"
    spec: OvercommitPolicySpec
    status: OvercommitPolicyStatus = Field(default_factory=OvercommitPolicyStatus)


Resource = (Hypervisor | Reservation | Lease | OvercommitPolicy | AccessToken
            | ResourceProvider | PlacementConsumer | PlacementName
            | HistorySeries)
# The fleet's public kinds: what apply, export, the CRDs, the API's discovery and
# an all-kinds watch know.
KINDS: dict[str, type[Resource]] = {
    "Hypervisor": Hypervisor,
    "Reservation": Reservation,
    "Lease": Lease,
    "OvercommitPolicy": OvercommitPolicy,
}
# Every kind a store backend holds and decodes: the public ones, plus access
# tokens, which only the token code and admins see (hvfleet.model.token).
# The Placement API's records (hvfleet.model.placement) are stored the same way.
STORED_KINDS: dict[str, type[Resource]] = {
    **KINDS, "AccessToken": AccessToken,
    "ResourceProvider": ResourceProvider, "PlacementConsumer": PlacementConsumer,
    "PlacementName": PlacementName,
    # the dashboard's history (model.dashboard)
    "HistorySeries": HistorySeries,
}
