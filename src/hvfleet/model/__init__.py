"""The resource model: names, quantities, Hypervisor, Reservation and capacity
arithmetic. Pure: no I/O, and nothing else of hvfleet is imported here.

The names below are loaded when first used, so importing one light module
(`hvfleet.model.errors`, `hvfleet.model.durations`) does not build every
pydantic model: the CLI's start-up depends on it (docs/benchmarks.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "capacity": ["effective_capacity", "free_capacity", "hypervisor_effective_capacity", "max_unit",
                 "reservation_phase", "with_effective_capacity"],
    "errors": ["AlreadyExists", "Conflict", "Forbidden", "Gone", "HvfleetError", "InvalidInput",
               "NotFound", "Unavailable"],
    "hostcaps": ["HostCapabilities"],
    "hypervisor": ["KINDS", "Cell", "Hypervisor", "HypervisorSpec", "HypervisorStatus", "Instance",
                   "Reservation", "ReservationSpec", "ReservationStatus", "Resource", "ResourceList"],
    "meta": ["API_VERSION", "Condition", "ObjectMeta"],
    "quantity": ["Quantity"],
    "resources": ["ResourceName"],
    "selectors": ["Selector", "parse_selector"],
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "API_VERSION", "KINDS", "AlreadyExists", "Cell", "Condition", "Conflict", "Forbidden",
    "Gone", "HostCapabilities", "HvfleetError", "Hypervisor", "HypervisorSpec",
    "HypervisorStatus", "Instance", "InvalidInput", "NotFound", "ObjectMeta", "Quantity",
    "Reservation", "ReservationSpec", "ReservationStatus", "Resource", "ResourceList",
    "ResourceName", "Selector", "Unavailable", "effective_capacity", "free_capacity",
    "hypervisor_effective_capacity", "max_unit", "parse_selector", "reservation_phase",
    "with_effective_capacity",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
