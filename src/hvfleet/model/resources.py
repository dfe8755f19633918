"""Resource names: the project's own type, mapped to Placement resource classes.

Well-known names are the lower-case ones libvirt lets the agent discover
(`cpu`, `memory`, ...). Anything libvirt cannot see (GPUs, NIC VFs, IOPS) is
named the way OpenStack Placement names resource classes (`VGPU`,
`CUSTOM_NIC_VF`), so the two systems agree on what a name means. Everything
else is refused: a typo must not silently become a new resource.
"""

from __future__ import annotations

import functools
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
}

# Hugepage pools, one resource per page size, for every size a host or guest
# may have (x86: 2Mi, 1Gi; arm64: 64Ki, 2Mi, 32Mi, 1Gi; POWER: 16Mi, 16Gi),
# so no list of sizes: `hugepages-<size>` as Kubernetes names it, the page
# size in its shortest binary form (`hugepages-2Mi`, never `hugepages-2048Ki`,
# so one size has one name), counted in bytes; in Placement the class
# `CUSTOM_HUGEPAGES_<SIZE>` (CUSTOM_HUGEPAGES_2MI), one unit a page.
HUGEPAGES_PREFIX = "hugepages-"
HUGEPAGES_CLASS_PREFIX = "CUSTOM_HUGEPAGES_"
HUGEPAGES_FORM = "hugepages-<page size> (hugepages-2Mi, hugepages-1Gi, hugepages-64Ki, hugepages-32Mi, …)"
_BINARY_SUFFIXES = (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_HUGEPAGES_RE = re.compile(r"^hugepages-([0-9]{1,20})(Ki|Mi|Gi)$")
_HUGEPAGES_CLASS_RE = re.compile(r"^CUSTOM_HUGEPAGES_([0-9]{1,20})(KI|MI|GI)$")


def _page_text(page_bytes: int) -> str:
    """A page size in its shortest binary form, as Kubernetes writes it (`32Mi`)."""
    for suffix, size in _BINARY_SUFFIXES:
        if page_bytes % size == 0:
            return f"{page_bytes // size}{suffix}"
    raise ValueError(f"a page of {page_bytes} bytes is not whole KiB")


def _is_page_size(page_bytes: int) -> bool:
    return page_bytes >= 2**10 and page_bytes & (page_bytes - 1) == 0


def hugepages_resource(page_bytes: int) -> ResourceName:
    """The resource of hugepages of `page_bytes` (a power of two, at least
    1 KiB): `hugepages-<N><Ki|Mi|Gi>`."""
    if not _is_page_size(page_bytes):
        raise ValueError(f"a hugepage of {page_bytes} bytes is not a power of two of at least 1Ki")
    return ResourceName(HUGEPAGES_PREFIX + _page_text(page_bytes))


def _hugepage_bytes(text: str, pattern: re.Pattern[str]) -> int | None:
    m = pattern.match(text)
    if m is None:
        return None
    return int(m.group(1)) * dict(_BINARY_SUFFIXES)[m.group(2).capitalize()]


@functools.lru_cache(maxsize=1024)  # read per resource on every fit and Placement view
def hugepage_size(name: str) -> int | None:
    """The page size in bytes of the hugepages resource `name`, None for any
    other resource."""
    if not str(name).startswith(HUGEPAGES_PREFIX):
        return None
    size = _hugepage_bytes(str(name), _HUGEPAGES_RE)
    return size if size is not None and _is_page_size(size) and hugepages_resource(size) == name else None


def _hugepages_error(text: str, where: str) -> InvalidInput:
    """Why `text`, written like a hugepages resource, is none."""
    size = _hugepage_bytes(text, _HUGEPAGES_RE)
    if size is not None and _is_page_size(size):
        canonical = hugepages_resource(size)
        return InvalidInput(f"{text}: write {canonical} (hugepages name their page size in its "
                            "shortest binary form, as Kubernetes does, so one size has one name)",
                            field=where)
    return InvalidInput(f"unknown resource {text!r}: a hugepage size is a power of two of at least 1Ki, "
                        f"written {HUGEPAGES_FORM}", field=where)


def _hugepages_class(page_bytes: int) -> PlacementClass:
    text = _page_text(page_bytes)
    return PlacementClass(HUGEPAGES_CLASS_PREFIX + text.upper(), f"pages of {text}B", page_bytes)


def resource_of_class(resource_class: str) -> ResourceName | None:
    """The well-known resource whose Placement class is `resource_class`
    (VCPU → cpu, CUSTOM_HUGEPAGES_32MI → hugepages-32Mi), or None. A
    hugepages class in another spelling than its size's shortest
    (CUSTOM_HUGEPAGES_2048KI) is named here too, so it is refused as a
    custom resource beside `hugepages-2Mi`; Placement never has it."""
    known = STANDARD_CLASSES.get(resource_class)
    if known is not None:
        return ResourceName(known)
    size = _hugepage_bytes(resource_class, _HUGEPAGES_CLASS_RE)
    return hugepages_resource(size) if size is not None and _is_page_size(size) else None


@functools.lru_cache(maxsize=1024)
def well_known_placement(name: str) -> PlacementClass | None:
    """The Placement class of a well-known resource (cpu, memory, disk,
    pcpu, hugepages of any size), None for a custom one."""
    known = WELL_KNOWN.get(name)
    if known is not None:
        return known
    size = hugepage_size(name)
    return _hugepages_class(size) if size is not None else None


# Placement's class of each well-known resource, back to its name: a custom
# resource of that name would be a second inventory of the same class (in
# `placement export` one overwrote the other, and its claims went with it).
# Hugepages classes are found by their form (`resource_of_class`).
STANDARD_CLASSES: dict[str, str] = {pc.resource_class: name for name, pc in WELL_KNOWN.items()}


def placement_alias_error(names: Iterable[str], where: str) -> InvalidInput | None:
    """The error for the first of `names` that is a well-known resource's
    Placement class (`VCPU` for `cpu`, `CUSTOM_HUGEPAGES_32MI` for
    `hugepages-32Mi`), or None. Checked where a resource is first named (a
    create, a spec change, a claim), not where one is read."""
    for name in names:
        own = resource_of_class(str(name))
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
    "one of " + ", ".join(WELL_KNOWN) + ", " + HUGEPAGES_FORM
    + ", one of Placement's standard resource classes "
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
    Placement name (`VCPU` beside `cpu`, `CUSTOM_HUGEPAGES_32MI` beside
    `hugepages-32Mi`, stored before `placement_alias_error`: it would be a
    second inventory of the class, one overwriting the other)."""
    if well_known_placement(name) is not None:
        return True
    return (name in _STANDARD or bool(_CUSTOM_CLASS_RE.match(name))) and resource_of_class(name) is None


# The resources counted in bytes (written in binary suffixes, shown as Gi/Mi,
# converted to MiB/GiB/pages for Placement): these and every hugepages pool.
# Everything else, the custom Placement classes included, counts whole or
# decimal units.
_IN_BYTES = frozenset({"memory", "disk"})

VALID_FORMS = (
    "one of " + ", ".join(WELL_KNOWN) + ", " + HUGEPAGES_FORM
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
        if text.startswith(HUGEPAGES_PREFIX) and _HUGEPAGES_RE.match(text):
            if hugepage_size(text) is not None:
                return cls(text)
            raise _hugepages_error(text, where)
        raise InvalidInput(f"unknown resource {text!r}: expected {VALID_FORMS}", field=where)

    @property
    def placement(self) -> PlacementClass:
        known = well_known_placement(str(self))
        return known if known is not None else PlacementClass(str(self), "unit")

    @property
    def page_size(self) -> int | None:
        """The page size in bytes of a hugepages resource, None for any other."""
        return hugepage_size(str(self))

    @property
    def in_placement(self) -> bool:
        """Whether Placement can have this resource's class (`in_placement`)."""
        return in_placement(str(self))

    @property
    def is_custom(self) -> bool:
        return well_known_placement(str(self)) is None

    @property
    def counts_bytes(self) -> bool:
        """Whether amounts of this resource are bytes (memory, disk, hugepage pools)."""
        return str(self) in _IN_BYTES or self.page_size is not None

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
HUGEPAGES_2MI = hugepages_resource(2 * 2**20)
HUGEPAGES_1GI = hugepages_resource(2**30)
