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
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, PlainSerializer, field_validator, model_validator

from hvfleet.model.hostcaps import HostCapabilities
from hvfleet.model.lease import Lease
from hvfleet.model.meta import API_VERSION, Condition, Model, ObjectMeta
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.model.selectors import Requirement, Selector
from hvfleet.model.token import AccessToken

ResourceList = dict[ResourceName, Quantity]


def check_ratio(resource: str, value: Any) -> float:
    """An overcommit ratio: a finite number > 0 (below 1 keeps part free)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"overcommit.{resource}: {value!r} is not a number")
    ratio = float(value)
    if not math.isfinite(ratio):
        raise ValueError(f"overcommit.{resource}: {value!r} is not finite")
    if ratio <= 0:
        raise ValueError(f"overcommit.{resource}: {value!r} must be greater than 0")
    return ratio


def _whole_as_integer(value: float) -> int | float:
    # As Go's encoding/json (so kube-apiserver) writes a float64: 4.0 is `4` on
    # the wire, and large values keep their exponent form. (A model_copy can
    # carry an int here: it skips validation.)
    number = float(value)
    return int(number) if number.is_integer() and abs(number) < 1e21 else number


# An overcommit ratio: a float in Python, an integer in JSON when it is whole.
OvercommitRatio = Annotated[float, PlainSerializer(_whole_as_integer, when_used="json")]


def _non_negative(field: str, values: ResourceList) -> ResourceList:
    for name, q in values.items():
        if q < 0:
            raise ValueError(f"{field}.{name}: {q} must not be negative")
    return values


class HypervisorSpec(Model):
    overcommit: dict[ResourceName, OvercommitRatio] = Field(default_factory=dict)
    reserved: ResourceList = Field(default_factory=dict)
    extra_capacity: ResourceList = Field(default_factory=dict)
    maintenance: Literal["", "manual", "drain"] = ""
    maintenance_reason: str = ""

    @field_validator("overcommit", mode="before")
    @classmethod
    def _ratios(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: check_ratio(str(k), r) for k, r in v.items()}
        return v

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
    id: int
    capacity: ResourceList = Field(default_factory=dict)
    allocation: ResourceList = Field(default_factory=dict)
    effective_capacity: ResourceList = Field(default_factory=dict)


class Instance(Model):
    uuid: str
    name: str
    state: str
    resources: ResourceList = Field(default_factory=dict)
    # Guest crashes the node agent saw (libvirt's lifecycle event CRASHED, which
    # pvpanic and the Hyper-V crash MSRs raise), counted for as long as the
    # instance is listed. Absent until the first crash, so documents written
    # before these fields existed, and instances that never crashed, read the same.
    crash_count: int | None = Field(default=None, ge=0)
    last_crash_time: datetime | None = None
    last_crash_reason: str | None = None  # "panicked" (pvpanic, Hyper-V) or "crashloaded"


class HypervisorStatus(Model):
    capacity: ResourceList = Field(default_factory=dict)
    allocation: ResourceList = Field(default_factory=dict)
    effective_capacity: ResourceList = Field(default_factory=dict)
    cells: list[Cell] = Field(default_factory=list)
    instances: list[Instance] = Field(default_factory=list)
    host_capabilities: HostCapabilities | None = None
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    last_heartbeat_time: datetime | None = None


class Hypervisor(Model):
    api_version: Literal["hvfleet.io/v1"] = API_VERSION
    kind: Literal["Hypervisor"] = "Hypervisor"
    metadata: ObjectMeta
    spec: HypervisorSpec = Field(default_factory=HypervisorSpec)
    status: HypervisorStatus = Field(default_factory=HypervisorStatus)

    @property
    def name(self) -> str:
        return self.metadata.name


ReservationPhase = Literal["Pending", "Active", "Confirmed", "Released", "Expired"]
# Phases in which a reservation still holds space on its host.
HOLDING_PHASES: frozenset[str] = frozenset({"Pending", "Active"})


class ReservationSpec(Model):
    hypervisor: str
    resources: ResourceList
    consumer: str
    expires_at: datetime | None = None
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


class ReservationStatus(Model):
    phase: ReservationPhase = "Pending"
    message: str = ""


class Reservation(Model):
    api_version: Literal["hvfleet.io/v1"] = API_VERSION
    kind: Literal["Reservation"] = "Reservation"
    metadata: ObjectMeta
    spec: ReservationSpec
    status: ReservationStatus = Field(default_factory=ReservationStatus)

    @property
    def name(self) -> str:
        return self.metadata.name


class LabelSelectorRequirement(Model):
    """One `matchExpressions` entry, as in Kubernetes' LabelSelector."""

    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

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

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def to_selector(self) -> Selector:
        reqs = [Requirement(k, "=", (v,)) for k, v in sorted(self.match_labels.items())]
        reqs += [
            Requirement(e.key, _OPS[e.operator], tuple(e.values))  # type: ignore[arg-type]
            for e in self.match_expressions
        ]
        return Selector(tuple(reqs))


class OvercommitPolicySpec(Model):
    selector: LabelSelector = Field(default_factory=LabelSelector)
    overcommit: dict[ResourceName, OvercommitRatio]
    # Higher wins where two matching policies give a ratio for the same resource;
    # at equal priority the policy whose name sorts first.
    priority: int = 0

    @field_validator("overcommit", mode="before")
    @classmethod
    def _ratios(cls, v: Any) -> Any:
        if isinstance(v, dict):
            if not v:
                raise ValueError("a policy must give at least one ratio")
            return {k: check_ratio(str(k), r) for k, r in v.items()}
        return v


class OvercommitPolicyStatus(Model):
    """Nothing is observed about a policy; the resource has a status so that it
    is shaped like the others (a CRD with a status subresource)."""


class OvercommitPolicy(Model):
    api_version: Literal["hvfleet.io/v1"] = API_VERSION
    kind: Literal["OvercommitPolicy"] = "OvercommitPolicy"
    metadata: ObjectMeta
    spec: OvercommitPolicySpec
    status: OvercommitPolicyStatus = Field(default_factory=OvercommitPolicyStatus)

    @property
    def name(self) -> str:
        return self.metadata.name


Resource = Hypervisor | Reservation | Lease | OvercommitPolicy | AccessToken
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
STORED_KINDS: dict[str, type[Resource]] = {**KINDS, "AccessToken": AccessToken}
