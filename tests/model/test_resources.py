from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model import Hypervisor, InvalidInput, ResourceName


@pytest.mark.parametrize(("name", "cls", "unit"), [
    ("cpu", "VCPU", "vCPU"), ("memory", "MEMORY_MB", "MiB"), ("disk", "DISK_GB", "GiB"),
    ("pcpu", "PCPU", "pCPU"), ("VGPU", "VGPU", "unit"), ("CUSTOM_NIC_VF", "CUSTOM_NIC_VF", "unit"),
])
def test_placement_mapping(name: str, cls: str, unit: str) -> None:
    r = ResourceName.parse(name)
    assert r.placement.resource_class == cls
    assert r.placement.unit == unit


def test_memory_converts_to_whole_mebibytes_rounding_down() -> None:
    mem = ResourceName.parse("memory")
    assert mem.to_placement_units(3 * 2**20 + 5) == 3
    assert mem.from_placement_units(3) == 3 * 2**20


@pytest.mark.parametrize("bad", ["Memory", "gpu", "cpus", "custom_x", "1VGPU", "hugepages-4Mi", "", "VG PU"])
def test_unknown_names_are_refused_listing_the_valid_forms(bad: str) -> None:
    with pytest.raises(InvalidInput, match=r"unknown resource .*cpu, memory.*\^\[A-Z\]"):
        ResourceName.parse(bad)


def test_unknown_resource_in_a_spec_is_a_validation_error() -> None:
    with pytest.raises(ValueError, match="unknown resource 'gpu'"):
        Hypervisor.model_validate({"metadata": {"name": "h"}, "spec": {"overcommit": {"gpu": 2}}})


@given(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,40}\Z"))
def test_every_placement_style_class_is_accepted(name: str) -> None:
    assert ResourceName.parse(name).placement.resource_class == name


@pytest.mark.parametrize(("name", "in_bytes"), [
    ("memory", True), ("disk", True), ("hugepages-2Mi", True), ("hugepages-1Gi", True),
    ("cpu", False), ("pcpu", False), ("VGPU", False), ("CUSTOM_NIC_VF", False),
    ("CUSTOM_HUGEPAGES_2MI", False),
])
def test_counts_bytes_is_one_property_of_the_name(name: str, in_bytes: bool) -> None:
    r = ResourceName.parse(name)
    assert r.counts_bytes is in_bytes
    assert r.quantity(2**30).format == ("binary" if in_bytes else "decimal")
    if not r.is_custom:  # Placement converts exactly the byte resources to MiB/GiB/pages
        assert (r.placement.base_per_unit > 1) is in_bytes


def test_byte_resources_render_in_binary_suffixes_everywhere() -> None:
    from hvfleet.cli.output import human

    assert str(ResourceName.parse("disk").quantity(100 * 2**30)) == "100Gi"
    assert str(ResourceName.parse("hugepages-2Mi").quantity(4 * 2**21)) == "8Mi"
    assert human(ResourceName.parse("disk"), ResourceName.parse("disk").quantity(3 * 2**29)) == "1.5Gi"
    assert human("VGPU", ResourceName.parse("VGPU").quantity(8)) == "8"


@given(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,40}\Z"))
def test_a_name_is_in_placement_exactly_when_placement_can_have_it_as_a_class(name: str) -> None:
    """A standard class of os-resource-classes or `CUSTOM_[A-Z0-9_]+`, as
    Placement's own schema for a new class; `ResourceName.parse` still
    reads every other (stored before the write-time check)."""
    import os_resource_classes

    from hvfleet.model.resources import placement_class_error

    expected = name in os_resource_classes.STANDARDS or (name.startswith("CUSTOM_") and len(name) > 7)
    assert ResourceName.parse(name).in_placement is expected
    error = placement_class_error([name], "spec.extraCapacity")
    assert (error is None) is expected
    if error is not None:
        assert error.field == f"spec.extraCapacity.{name}" and "CUSTOM_" in str(error)
    # A name the field held before passes (an update of a value stored before the check).
    assert placement_class_error([name], "spec.extraCapacity", before=[name]) is None


def test_the_well_known_resources_are_in_placement() -> None:
    from hvfleet.model.resources import WELL_KNOWN

    assert all(ResourceName.parse(n).in_placement for n in WELL_KNOWN)


def test_a_create_naming_what_placement_cannot_have_is_refused_and_an_update_keeping_it_is_taken() -> None:
    from datetime import UTC, datetime

    from hvfleet.model.kinds import strategy

    s = strategy("Hypervisor")
    bad = Hypervisor.model_validate({"metadata": {"name": "h"}, "spec": {"extraCapacity": {"FOO": "2"}}})
    with pytest.raises(InvalidInput, match="FOO can never be a Placement resource class") as exc:
        s.validate_create(bad, "operator")
    assert exc.value.field == "spec.extraCapacity.FOO"
    changed = bad.model_copy(update={"spec": bad.spec.model_copy(update={"maintenance": "manual",
                                                                          "maintenance_reason": "x"})})
    s.validate_update(bad, changed, "operator", datetime.now(UTC))
