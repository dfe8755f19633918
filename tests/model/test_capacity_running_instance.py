"""What a claim holds while its consumer's instance runs (model/capacity.py:
`held_resources`, `beyond_libvirt`, `claim_holds`): all of what libvirt
cannot see, and of what it sees only what exceeds libvirt's count of that
instance; a hugepage-backed guest's memory is counted in its hugepage pool.
Expected values computed by hand from the same drawn numbers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
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


@pytest.mark.parametrize("pages", ["hugepages-32Mi", "hugepages-64Ki", "hugepages-16Gi"])
def test_guest_memory_in_any_page_size_covers_its_memory_claim(pages: str) -> None:
    h = _host({"cpu": 2, "memory": 0, pages: 16 * GI})
    assert cap.held_resources(_claim({"cpu": 2, "memory": 16 * GI}), h, NOW) == {}
    more = _claim({"cpu": 2, "memory": 18 * GI})
    assert cap.held_resources(more, h, NOW) == {R("memory"): Quantity(2 * GI)}


def test_an_instance_listed_without_resources_counts_all_its_claim_has_of_what_libvirt_sees() -> None:
    h = _host({})
    assert cap.held_resources(_claim({"cpu": 8, "memory": GI, "VGPU": 1}), h, NOW) == {R("VGPU"): Quantity(1)}


# Every word `status.instances[].state` takes (discovery.domains.DOMAIN_STATES),
# and one the agent writes for a number libvirt may add.
_STATES = ["nostate", "running", "blocked", "paused", "shutdown", "shutoff", "crashed",
           "pmsuspended", "unknown(9)"]


def _host_in(state: str, count_mode: str | None, instance: dict[str, int]) -> Hypervisor:
    status: dict[str, object] = {
        "capacity": {"cpu": 64, "memory": 64 * GI}, "allocation": {"cpu": 0, "memory": 0},
        "instances": [{"uuid": "vm", "name": "vm", "state": state, "resources": instance}]}
    if count_mode is not None:
        status["countMode"] = count_mode
    return Hypervisor.model_validate({"metadata": {"name": "hv1"}, "status": status})


@given(state=st.sampled_from(_STATES), count_mode=st.sampled_from(["defined", "running", None]),
       claim_cpu=st.integers(1, 16), vm_cpu=st.integers(0, 16), vgpu=st.integers(0, 2))
def test_a_claim_holds_all_it_has_while_libvirts_allocation_leaves_its_instance_out(
        state: str, count_mode: str | None, claim_cpu: int, vm_cpu: int, vgpu: int) -> None:
    # The agent counts an active domain in every mode (a crashed one libvirt
    # keeps is active: its QEMU process holds its memory), a shut-off one only
    # under --count defined; a status that does not say its mode (written
    # before the agent recorded it) counts only what is active.
    counted = state != "shutoff" or count_mode == "defined"
    resources = {"cpu": claim_cpu, "memory": GI, **({"VGPU": vgpu} if vgpu else {})}
    h = _host_in(state, count_mode, {"cpu": vm_cpu, "memory": GI})
    claim = _claim(resources)
    if counted:
        expected = {R("VGPU"): Quantity(vgpu)} if vgpu else {}
        if claim_cpu > vm_cpu:
            expected[R("cpu")] = Quantity(claim_cpu - vm_cpu)
    else:
        expected = dict(claim.spec.resources)
    assert cap.held_resources(claim, h, NOW) == expected
    assert cap.claim_holds("vm", claim.spec.resources, h) == expected
    assert cap.counted_in_allocation(h.status.instances[0], h) is counted
    # Listed in any state, the instance is there: the claim is Confirmed and
    # no longer expires, so a shut-off guest's claim outlives its TTL.
    expiring = claim.model_copy(update={"spec": claim.spec.model_copy(update={"expires_at": NOW})})
    assert cap.reservation_phase(expiring, h, NOW) == "Confirmed"
    assert cap.held_resources(expiring, h, NOW) == expected
    # Free capacity counts the instance once: in the allocation, or in the claim.
    in_allocation = vm_cpu if counted else 0
    allocation = {R("cpu"): Quantity(in_allocation), R("memory"): Quantity(GI if counted else 0)}
    h = h.model_copy(update={"status": h.status.model_copy(update={"allocation": allocation})})
    free = cap.free_capacity(h, [claim], NOW)
    assert free[R("cpu")] == Quantity(64 - (max(claim_cpu, vm_cpu) if counted else claim_cpu))
    assert free[R("memory")] == Quantity(63 * GI)


def test_a_status_without_its_count_mode_counts_a_shut_off_instance_as_not_in_the_allocation() -> None:
    # Written before the agent recorded its mode: the claim holds all it has.
    h = _host_in("shutoff", None, {"cpu": 4, "memory": GI})
    claim = _claim({"cpu": 4, "memory": GI})
    assert cap.held_resources(claim, h, NOW) == claim.spec.resources
