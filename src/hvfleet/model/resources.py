"""Resource names: the project's own type, mapped to Placement resource classes.

Well-known names are the lower-case ones libvirt lets the agent discover
(`cpu`, `memory`, ...). Anything libvirt cannot see (GPUs, NIC VFs, IOPS) is
named the way OpenStack Placement names resource classes (`VGPU`,
`CUSTOM_NIC_VF`), so the two systems agree on what a name means. Everything
else is refused: a typo must not silently become a new resource.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from hvfleet.model.errors import InvalidInput
from hvfleet.model.quantity import Quantity, text_schema
from hvfleet.model.standard_classes import STANDARD_RESOURCE_CLASSES

_CLASS_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
# The names Placement can have as a class: os-resource-classes' standard ones
# and custom ones (Placement's own schema for a new class).
_CUSTOM_CLASS_RE = re.compile(r"^CUSTOM_[A-Z0-9_]+$")
_STANDARD = frozenset(STANDARD_RESOURCE_CLASSES)
_MAX_LEN = 255  # Placement's limit for a resource class name


@dataclass(frozen=True)
class PlacementClass:
    """How a resource appears in Placement: its class and the unit it counts in."""

    resource_class: str
    unit: str
    # One Placement unit in hvfleet's base unit (e.g. MEMORY_MB: 1 MiB = 2**20 bytes).
    base_per_unit: int = 1


WELL_KNOWN: dict[str, PlacementClass] = {
    "cpu": PlacementClass("VCPU", "vCPU"),
    "memory": PlacementClass("MEMORY_MB", "MiB", 2**20),
    "disk": PlacementClass("DISK_GB", "GiB", 2**30),
    "pcpu": PlacementClass("PCPU", "pCPU"),
    "hugepages-2Mi": PlacementClass("CUSTOM_HUGEPAGES_2MI", "pages of 2MiB", 2 * 2**20),
    "hugepages-1Gi": PlacementClass("CUSTOM_HUGEPAGES_1GI", "pages of 1GiB", 2**30),
}

# Placement's class of each well-known resource, back to its name: a custom
# resource of that name would be a second inventory of the same class (in
# `placement export` one overwrote the other, and its claims went with it).
STANDARD_CLASSES: dict[str, str] = {pc.resource_class: name for name, pc in WELL_KNOWN.items()}


def placement_alias_error(names: Iterable[str], where: str) -> InvalidInput | None:
    """The error for the first of `names` that is a well-known resource's
    Placement class (`VCPU` for `cpu`), or None. Checked where a resource is
    first named (a create, a spec change, a claim), not where one is read."""
    for name in names:
        own = STANDARD_CLASSES.get(str(name))
        if own is not None:
            return InvalidInput(f"{name} is Placement's class of the resource {own!r}: write {own!r} "
                                f"(a resource {name!r} beside it would count the same class twice)",
                                field=f"{where}.{name}")
    return None


def whole_units_error(values: Mapping[ResourceName, Quantity], where: str) -> InvalidInput | None:
    """The error for the first amount of `values` that is not a whole number
    of its resource's Placement unit (`500m` cpu, `100M` of memory), or None.
    Placement counts whole units, so an amount hvfleet holds, reserves or
    adds must be one, or fit and Placement would disagree at the margin.
    Checked where an amount is first given (a create, a spec change, a
    claim); one stored before is read rounded as Placement reads it
    (`hvfleet.model.capacity`)."""
    for name, q in values.items():
        r = ResourceName.parse(name, where=where)  # a model_copy may carry plain text keys
        pc = r.placement
        # A model_copy's update may carry the raw value (`"1Gi"`, `4`), not a Quantity.
        value = (q if isinstance(q, Quantity) else Quantity.parse(q, where=f"{where}.{name}")).value
        if (value / pc.base_per_unit).denominator != 1:
            return InvalidInput(f"{q} is not a whole number of {pc.resource_class} units ({pc.unit}): "
                                "Placement counts whole units", field=f"{where}.{name}")
    return None


PLACEMENT_FORMS = (
    "one of " + ", ".join(WELL_KNOWN) + ", one of Placement's standard resource classes "
    "(VGPU, PCI_DEVICE, SRIOV_NET_VF, …) or a custom class CUSTOM_[A-Z0-9_]+ (e.g. CUSTOM_NIC_VF)"
)


def placement_class_error(names: Iterable[str], where: str,
                          before: Iterable[str] = ()) -> InvalidInput | None:
    """The error for the first of `names` that Placement can never have as a
    resource class (`FOO`: neither standard nor `CUSTOM_*`), or None; names
    in `before` (what the field held before this write) pass. Checked, like
    `placement_alias_error`, where a resource is first named, never where one
    is read: a name stored before this check stays readable, and the
    Placement view leaves it out (hvfleet.scheduling.placement)."""
    held = {str(n) for n in before}
    for name in names:
        if str(name) not in held and not in_placement(str(name)):
            return InvalidInput(f"{name} can never be a Placement resource class: expected {PLACEMENT_FORMS}",
                                field=f"{where}.{name}")
    return None


def in_placement(name: str) -> bool:
    """Whether the resource `name` is one Placement can have: a well-known
    resource (its class is standard or CUSTOM_HUGEPAGES_*), a standard class
    or a CUSTOM_* class, but not a well-known resource's class under its
    Placement name (`VCPU` beside `cpu`, stored before `placement_alias_error`:
    it would be a second inventory of the class, one overwriting the other)."""
    if name in WELL_KNOWN:
        return True
    return (name in _STANDARD or bool(_CUSTOM_CLASS_RE.match(name))) and name not in STANDARD_CLASSES


# The resources counted in bytes (written in binary suffixes, shown as Gi/Mi,
# converted to MiB/GiB for Placement). Everything else, the custom Placement
# classes included, counts whole or decimal units.
_IN_BYTES = frozenset({"memory", "disk", "hugepages-2Mi", "hugepages-1Gi"})

VALID_FORMS = (
    "one of " + ", ".join(WELL_KNOWN)
    + ", or a Placement resource class matching ^[A-Z][A-Z0-9_]*$ (e.g. VGPU, CUSTOM_NIC_VF)"
)


class ResourceName(str):
    """A validated resource name. Construct with `ResourceName.parse`."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: Any, *, where: str = "resource") -> ResourceName:
        if isinstance(text, ResourceName):
            return text
        if not isinstance(text, str):
            raise InvalidInput("resource name must be a string", field=where)
        if text in WELL_KNOWN or (len(text) <= _MAX_LEN and _CLASS_RE.match(text)):
            return cls(text)
        raise InvalidInput(f"unknown resource {text!r}: expected {VALID_FORMS}", field=where)

    @property
    def placement(self) -> PlacementClass:
        known = WELL_KNOWN.get(str(self))
        return known if known is not None else PlacementClass(str(self), "unit")

    @property
    def in_placement(self) -> bool:
        """Whether Placement can have this resource's class (`in_placement`)."""
        return in_placement(str(self))

    @property
    def is_custom(self) -> bool:
        return str(self) not in WELL_KNOWN

    @property
    def counts_bytes(self) -> bool:
        """Whether amounts of this resource are bytes (memory, disk, hugepage pools)."""
        return str(self) in _IN_BYTES

    def quantity(self, value: int | Fraction | Quantity) -> Quantity:
        """`value` as a Quantity of this resource: binary suffixes for bytes,
        whatever form a given Quantity was written in (`8589934592` → `8Gi`)."""
        amount = value.value if isinstance(value, Quantity) else value
        return Quantity(amount, "binary" if self.counts_bytes else "decimal")

    def to_placement_units(self, amount: Fraction | int) -> int:
        """An amount in hvfleet's base unit → whole Placement units (rounded down:
        Placement can only promise what is fully there)."""
        return int(Fraction(amount) // self.placement.base_per_unit)

    def from_placement_units(self, units: int) -> int:
        return units * self.placement.base_per_unit

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return text_schema(cls.parse, core_schema.str_schema())

    @classmethod
    def __get_pydantic_json_schema__(cls, _schema: Any, _handler: Any) -> dict[str, Any]:
        return {"type": "string"}


CPU = ResourceName("cpu")
MEMORY = ResourceName("memory")
DISK = ResourceName("disk")
PCPU = ResourceName("pcpu")
HUGEPAGES_2MI = ResourceName("hugepages-2Mi")
HUGEPAGES_1GI = ResourceName("hugepages-1Gi")
