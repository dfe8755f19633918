from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model import Hypervisor, InvalidInput, ResourceName


@pytest.mark.parametrize(("name", "cls", "unit"), [
    ("cpu", "VCPU", "vCPU"), ("memory", "MEMORY_MB", "MiB"), ("disk", "DISK_GB", "GiB"),
    ("pcpu", "PCPU", "pCPU"), ("VGPU", "VGPU", "unit"), ("CUSTOM_NIC_VF", "CUSTOM_NIC_VF", "unit"),
    ("hugepages-2Mi", "CUSTOM_HUGEPAGES_2MI", "pages of 2MiB"),
    ("hugepages-1Gi", "CUSTOM_HUGEPAGES_1GI", "pages of 1GiB"),
])
def test_placement_mapping(name: str, cls: str, unit: str) -> None:
    r = ResourceName.parse(name)
    assert r.placement.resource_class == cls
    assert r.placement.unit == unit


def test_memory_converts_to_whole_mebibytes_rounding_down() -> None:
    mem = ResourceName.parse("memory")
    assert mem.to_placement_units(3 * 2**20 + 5) == 3
    assert mem.from_placement_units(3) == 3 * 2**20


@pytest.mark.parametrize("bad", ["Memory", "gpu", "cpus", "custom_x", "1VGPU", "hugepages-", "hugepages-2M",
                                 "hugepages-1Ti", "", "VG PU"])
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


_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


@given(st.integers(0, 29))
def test_hugepages_of_every_power_of_two_size_are_named_counted_and_classed_alike(k: int) -> None:
    """A page of 2^k KiB is the resource `hugepages-<N><Ki|Mi|Gi>` in the
    page size's shortest binary form (as Kubernetes writes it), counted in
    bytes, whose Placement class is `CUSTOM_HUGEPAGES_<N><KI|MI|GI>` and whose
    Placement unit is one page; no list of sizes."""
    from hvfleet.model.resources import hugepages_resource, placement_alias_error, whole_units_error
    from hvfleet.scheduling.placement import resource_for_class

    size = 2**k * 1024
    name = hugepages_resource(size)
    number, suffix = name.removeprefix("hugepages-")[:-2], name[-2:]
    assert name.startswith("hugepages-") and suffix in _SUFFIXES
    assert int(number) * _SUFFIXES[suffix] == size and str(int(number)) == number
    assert int(number) < 1024 or suffix == "Gi"  # the shortest form
    r = ResourceName.parse(name)
    assert r == name and not r.is_custom and r.in_placement and r.counts_bytes
    assert r.placement.resource_class == f"CUSTOM_HUGEPAGES_{number}{suffix.upper()}"
    assert r.placement.unit == f"pages of {number}{suffix}B"
    assert r.placement.base_per_unit == size
    assert r.to_placement_units(3 * size + 1) == 3 and r.from_placement_units(3) == 3 * size
    assert str(r.quantity(size)) == f"{number}{suffix}"
    # Placement's class maps back to the resource, and is refused as a custom resource beside it.
    assert resource_for_class(r.placement.resource_class) == r
    alias = placement_alias_error([r.placement.resource_class], "spec.extraCapacity")
    assert alias is not None and f"write {name!r}" in str(alias)
    # Whole pages only, as Placement counts them.
    assert whole_units_error({r: r.quantity(5 * size)}, "spec.reserved") is None
    half = whole_units_error({r: r.quantity(5 * size + size // 2)}, "spec.reserved")
    assert half is not None and r.placement.resource_class in str(half)
    # Another spelling of the same size is refused, naming the canonical one.
    if suffix != "Ki":
        smaller = {"Mi": "Ki", "Gi": "Mi"}[suffix]
        other = f"hugepages-{int(number) * 1024}{smaller}"
        with pytest.raises(InvalidInput, match=f"write {name}"):
            ResourceName.parse(other)


@pytest.mark.parametrize(("bad", "why"), [
    ("hugepages-3Mi", "power of two"), ("hugepages-0Ki", "power of two"),
    ("hugepages-1536Ki", "power of two"),
    ("hugepages-2048Ki", "write hugepages-2Mi"), ("hugepages-1024Mi", "write hugepages-1Gi"),
    ("hugepages-02Mi", "write hugepages-2Mi"),
])
def test_a_hugepage_size_that_is_no_page_or_not_its_shortest_form_is_refused_saying_why(
        bad: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        ResourceName.parse(bad)


def test_the_arm_and_power_page_sizes_have_their_kubernetes_names() -> None:
    from hvfleet.model.resources import hugepages_resource

    sizes_kib = (64, 2048, 32768, 16384, 1048576, 16 * 1048576)
    assert [hugepages_resource(kib * 1024) for kib in sizes_kib] == [
        "hugepages-64Ki", "hugepages-2Mi", "hugepages-32Mi", "hugepages-16Mi", "hugepages-1Gi",
        "hugepages-16Gi"]


@pytest.mark.parametrize("cls", ["CUSTOM_HUGEPAGES_2MI", "CUSTOM_HUGEPAGES_1GI", "CUSTOM_HUGEPAGES_32MI",
                                 "CUSTOM_HUGEPAGES_64KI", "CUSTOM_HUGEPAGES_16GI"])
def test_every_hugepage_class_as_a_custom_resource_is_refused_naming_its_resource(cls: str) -> None:
    s_name = "hugepages-" + cls.removeprefix("CUSTOM_HUGEPAGES_")[:-2] + cls[-2:].capitalize()
    h = Hypervisor.model_validate({"metadata": {"name": "h"}, "spec": {"extraCapacity": {cls: "2"}}})
    from hvfleet.model.kinds import strategy

    with pytest.raises(InvalidInput, match=f"Placement's class of the resource '{s_name}'"):
        strategy("Hypervisor").validate_create(h, "operator")
