"""What a claim holds while its consumer's instance runs (model/capacity.py:
`held_resources`, `beyond_libvirt`, `claim_holds`): all of what libvirt
cannot see, and of what it sees only what exceeds libvirt's count of that
instance; a hugepage-backed guest's memory is counted in its hugepage pool.
Expected values computed by hand from the same drawn numbers."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model import Hypervisor, Quantity, Reservation, ResourceName
from hvfleet.model import capacity as cap

GI = 2**30
R = ResourceName.parse
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _host(instance: dict[str, int] | None) -> Hypervisor:
    status: dict[str, object] = {"capacity": {"cpu": 64, "memory": 64 * GI, "hugepages-1Gi": 16 * GI},
                                 "allocation": {"cpu": 0, "memory": 0}}
    if instance is not None:
        status["instances"] = [{"uuid": "vm", "name": "vm", "state": "running", "resources": instance}]
    return Hypervisor.model_validate({"metadata": {"name": "hv1"}, "status": status})


def _claim(resources: dict[str, int]) -> Reservation:
    return Reservation.model_validate({
        "metadata": {"name": "c"}, "spec": {"hypervisor": "hv1", "resources": resources, "consumer": "vm"},
        "status": {"phase": "Active"}})


@given(claim_cpu=st.integers(1, 16), claim_gib=st.integers(1, 16), vgpu=st.integers(1, 4),
       vm_cpu=st.integers(0, 16), vm_gib=st.integers(0, 16))
def test_a_running_instances_claim_holds_what_libvirt_does_not_count_of_it(
        claim_cpu: int, claim_gib: int, vgpu: int, vm_cpu: int, vm_gib: int) -> None:
    resources = {"cpu": claim_cpu, "memory": claim_gib * GI, "VGPU": vgpu}
    h = _host({"cpu": vm_cpu, "memory": vm_gib * GI})
    expected = {R("VGPU"): Quantity(vgpu)}
    if claim_cpu > vm_cpu:
        expected[R("cpu")] = Quantity(claim_cpu - vm_cpu)
    if claim_gib > vm_gib:
        expected[R("memory")] = Quantity((claim_gib - vm_gib) * GI)
    claim = _claim(resources)
    assert cap.held_resources(claim, h, NOW) == expected
    # A claim made now is checked for exactly what it will hold once written.
    assert cap.claim_holds("vm", claim.spec.resources, h) == expected
    # Before the instance runs, and for another consumer, all of it.
    assert cap.held_resources(claim, _host(None), NOW) == claim.spec.resources
    assert cap.claim_holds("other", claim.spec.resources, h) == claim.spec.resources


def test_a_hugepage_backed_guests_memory_claim_is_covered_by_its_hugepages() -> None:
    h = _host({"cpu": 2, "memory": 0, "hugepages-1Gi": 4 * GI})
    assert cap.held_resources(_claim({"cpu": 2, "memory": 4 * GI}), h, NOW) == {}
    assert cap.held_resources(_claim({"cpu": 2, "memory": 6 * GI}), h, NOW) == {R("memory"): Quantity(2 * GI)}


def test_an_instance_listed_without_resources_counts_all_its_claim_has_of_what_libvirt_sees() -> None:
    h = _host({})
    assert cap.held_resources(_claim({"cpu": 8, "memory": GI, "VGPU": 1}), h, NOW) == {R("VGPU"): Quantity(1)}
