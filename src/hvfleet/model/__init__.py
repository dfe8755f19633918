"""The resource model: names, quantities, Hypervisor, Reservation and capacity
arithmetic. Pure: no I/O, and nothing else of hvfleet is imported here."""

from hvfleet.model.capacity import (
    effective_capacity,
    free_capacity,
    hypervisor_effective_capacity,
    max_unit,
    reservation_phase,
    with_effective_capacity,
)
from hvfleet.model.errors import (
    AlreadyExists,
    Conflict,
    Forbidden,
    Gone,
    HvfleetError,
    InvalidInput,
    NotFound,
    Unavailable,
)
from hvfleet.model.hostcaps import HostCapabilities
from hvfleet.model.hypervisor import (
    KINDS,
    Cell,
    Hypervisor,
    HypervisorSpec,
    HypervisorStatus,
    Instance,
    Reservation,
    ReservationSpec,
    ReservationStatus,
    Resource,
    ResourceList,
)
from hvfleet.model.meta import API_VERSION, Condition, ObjectMeta
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.model.selectors import Selector, parse_selector

__all__ = [
    "API_VERSION", "KINDS", "AlreadyExists", "Cell", "Condition", "Conflict", "Forbidden",
    "Gone", "HostCapabilities", "HvfleetError", "Hypervisor", "HypervisorSpec",
    "HypervisorStatus", "Instance", "InvalidInput", "NotFound", "ObjectMeta", "Quantity",
    "Reservation", "ReservationSpec", "ReservationStatus", "Resource", "ResourceList",
    "ResourceName", "Selector", "Unavailable", "effective_capacity", "free_capacity",
    "hypervisor_effective_capacity", "max_unit", "parse_selector", "reservation_phase",
    "with_effective_capacity",
]
