"""A changed allocation of a running instance is counted once.

Once the consumer's instance shows in libvirt (the agent lists it in
status.instances, and the host's allocation counts its vCPUs and memory),
its claim holds only what libvirt does not count of it: what libvirt
cannot see (VGPU) and, of what it sees, what the allocation has beyond the
instance's own count. So a PUT of that consumer's allocation, unchanged or
resized, is judged as Placement judges it: usage − old allocation + new
allocation ≤ capacity, per resource (with max_unit, min_unit and
step_size). Through a real `hvfleet serve`, `hvfleet reserve`'s claim on a
real store, and hypothesis against real Placement 16.0 in process."""

from __future__ import annotations

import itertools
import tempfile
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model.hypervisor import Hypervisor, Instance
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.placement.allocations import ConsumerRequest, set_allocations
from hvfleet.placement.errors import PlacementConflict
from hvfleet.placement.graph import Inventory
from hvfleet.placement.records import Source
from hvfleet.scheduling.claims import reserve
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.placement import export_inventories
from hvfleet.scheduling.request import Request
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager
from tests.placement import inprocess_placement as real
from tests.placement.support import Placement, _served_sqlite, _uuid
from tests.scheduling.sched_fleet import host, put_host

CPU, MEMORY = ResourceName.parse("cpu"), ResourceName.parse("memory")
_names = itertools.count()


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    yield from _served_sqlite(seeded=False)


def _boots(store: Store, name: str, consumer: str, vcpus: int, memory_mb: int) -> None:
    """The agent's next status: the consumer's domain running, counted in the
    host's allocation (libvirt's count of the instance: `vcpus`, `memory_mb`)."""

    def observe(h: Hypervisor) -> Hypervisor:
        used = {CPU: Quantity(vcpus), MEMORY: Quantity.parse(f"{memory_mb}Mi")}
        vm = Instance(uuid=consumer, name=f"vm-{consumer[:8]}", state="running", resources=used)
        allocation = {r: h.status.allocation.get(r, Quantity(0)) + q for r, q in used.items()}
        return h.model_copy(update={"status": h.status.model_copy(update={
            "instances": [*h.status.instances, vm], "allocation": allocation,
            "last_heartbeat_time": datetime.now(UTC)})})

    store.update_hypervisor(name, observe, agent_manager(name))


def _body(uid: str, resources: dict[str, int], generation: int | None) -> dict[str, Any]:
    return {"allocations": {uid: {"resources": resources}}, "project_id": "p", "user_id": "u",
            "consumer_generation": generation, "consumer_type": "INSTANCE"}


def test_a_running_instances_allocation_put_again_or_resized_on_a_full_host_counts_it_once(
        api: Placement) -> None:
    """A host with room for nothing more, a running instance with a 2-vCPU
    allocation: the same allocation PUT again, and a resize 2 → 2 vCPUs with
    one more VGPU (the last), are taken as real Placement takes them; a resize
    to 3 vCPUs is not (4 − 2 + 3 > 4), and no other claim fits afterwards."""
    name = f"hv-run-{next(_names)}"
    put_host(api.store, host(name, {"cpu": 4, "memory": "4Gi"}, extra={"VGPU": 3},
                             beat=datetime.now(UTC)))
    uid = _uuid(api.store, name)
    vm, other = str(uuid.uuid4()), str(uuid.uuid4())
    made = {"VCPU": 2, "MEMORY_MB": 2048, "VGPU": 1}
    assert api.call("PUT", f"/allocations/{vm}", "scheduler", _body(uid, made, None)).status_code == 204
    _boots(api.store, name, vm, 2, 2048)
    assert api.call("PUT", f"/allocations/{other}", "scheduler",
                    _body(uid, {"VCPU": 2, "MEMORY_MB": 2048, "VGPU": 1}, None)).status_code == 204
    full = {"VCPU": 4, "MEMORY_MB": 4096, "VGPU": 2}
    assert api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"] == full

    again = api.call("PUT", f"/allocations/{vm}", "scheduler", _body(uid, made, 1))
    assert again.status_code == 204, again.text
    resized = {"VCPU": 2, "MEMORY_MB": 2048, "VGPU": 2}
    r = api.call("PUT", f"/allocations/{vm}", "scheduler", _body(uid, resized, 2))
    assert r.status_code == 204, r.text
    assert api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"] == {**full, "VGPU": 3}
    got = api.call("GET", f"/allocations/{vm}").json()
    assert got["allocations"][uid]["resources"] == resized and got["consumer_generation"] == 3

    bigger = api.call("PUT", f"/allocations/{vm}", "scheduler",
                      _body(uid, {**resized, "VCPU": 3}, 3))
    assert bigger.status_code == 409 and "exceed the capacity" in bigger.text, bigger.text
    late = api.call("PUT", f"/allocations/{uuid.uuid4()}", "scheduler", _body(uid, {"VCPU": 1}, None))
    assert late.status_code == 409, late.text
    assert api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"] == {**full, "VGPU": 3}
    assert len([r for r in api.store.list_reservations() if r.spec.consumer == vm]) == 1


def test_a_running_instance_grown_past_libvirts_count_holds_the_difference(api: Placement) -> None:
    """A resize 2 → 3 vCPUs with one vCPU free is taken, and the claim holds the
    vCPU the instance does not have yet: the next 1-vCPU claim is refused, the
    usage is the allocations' sum, never more than the capacity."""
    name = f"hv-run-{next(_names)}"
    put_host(api.store, host(name, {"cpu": 4, "memory": "4Gi"}, beat=datetime.now(UTC)))
    uid = _uuid(api.store, name)
    vm, other = str(uuid.uuid4()), str(uuid.uuid4())
    assert api.call("PUT", f"/allocations/{vm}", "scheduler",
                    _body(uid, {"VCPU": 2, "MEMORY_MB": 1024}, None)).status_code == 204
    _boots(api.store, name, vm, 2, 1024)
    assert api.call("PUT", f"/allocations/{other}", "scheduler",
                    _body(uid, {"VCPU": 1}, None)).status_code == 204
    r = api.call("PUT", f"/allocations/{vm}", "scheduler", _body(uid, {"VCPU": 3, "MEMORY_MB": 1024}, 1))
    assert r.status_code == 204, r.text
    usages = api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]
    assert usages == {"VCPU": 4, "MEMORY_MB": 1024}
    late = api.call("PUT", f"/allocations/{uuid.uuid4()}", "scheduler", _body(uid, {"VCPU": 1}, None))
    assert late.status_code == 409 and "exceed the capacity" in late.text, late.text


def test_a_running_instances_resize_races_other_claims_and_never_overbooks(api: Placement) -> None:
    """8 clients: one resizes a running instance 2 → 4 vCPUs, seven claim 1 vCPU
    each, with 3 free: what is taken never exceeds the host, and the provider's
    usage is exactly what was taken (the instance counted once)."""
    name = f"hv-run-{next(_names)}"
    put_host(api.store, host(name, {"cpu": 5, "memory": "4Gi"}, beat=datetime.now(UTC)))
    uid = _uuid(api.store, name)
    vm = str(uuid.uuid4())
    assert api.call("PUT", f"/allocations/{vm}", "scheduler",
                    _body(uid, {"VCPU": 2}, None)).status_code == 204
    _boots(api.store, name, vm, 2, 0)
    taken: dict[str, int] = {}
    lock = threading.Lock()

    def claim(consumer: str, vcpus: int, generation: int | None) -> None:
        for _attempt in range(20):
            body = _body(uid, {"VCPU": vcpus}, generation)
            r = api.call("PUT", f"/allocations/{consumer}", "scheduler", body)
            if r.status_code == 204:
                with lock:
                    taken[consumer] = vcpus
                return
            assert r.status_code == 409, r.text
            if "Unable to allocate inventory" in r.text:
                return  # full, not a race to retry

    threads = [threading.Thread(target=claim, args=(vm, 4, 1))]
    threads += [threading.Thread(target=claim, args=(str(uuid.uuid4()), 1, None)) for _ in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    vcpus = (4 if vm in taken else 2) + sum(n for c, n in taken.items() if c != vm)
    assert vcpus == 5  # full, never past it: whichever order, the last vCPU was taken
    assert api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]["VCPU"] == vcpus


def test_hvfleet_reserve_for_a_running_instance_needs_only_what_libvirt_does_not_count() -> None:
    """`hvfleet reserve`'s claim shares the rule: a claim for a consumer whose
    instance runs on a full host is taken when libvirt counts all it asks,
    refused when it asks more than that and the host has no room."""
    d = Path(tempfile.mkdtemp())
    store = open_store(f"sqlite:///{d}/hvfleet.db")
    try:
        put_host(store, host("hv-full", {"cpu": 4, "memory": "4Gi"}, allocation={"cpu": 2, "memory": "3Gi"},
                             beat=datetime.now(UTC)))
        vm = str(uuid.uuid4())
        _boots(store, "hv-full", vm, 2, 1024)
        with pytest.raises(DoesNotFit):
            reserve(store, "hv-full", Request({CPU: Quantity(3)}), vm)
        with pytest.raises(DoesNotFit):
            reserve(store, "hv-full", Request({CPU: Quantity(1)}), str(uuid.uuid4()))
        claim = reserve(store, "hv-full", Request({CPU: Quantity(2), MEMORY: Quantity.parse("1Gi")}), vm)
        assert claim.spec.consumer == vm
    finally:
        store.close()


# -- against real Placement ------------------------------------------------------------

_store_dir = Path(tempfile.mkdtemp())
_STORE: list[Store] = []


def _store() -> Store:
    if not _STORE:
        _STORE.append(open_store(f"sqlite:///{_store_dir}/hvfleet.db"))
    return _STORE[0]


def _real_put(consumer: str, uid: str, resources: dict[str, int], generation: int | None) -> bool:
    status, doc = real.call("PUT", f"/allocations/{consumer}", _body(uid, resources, generation))
    assert status in (204, 409), doc
    return status == 204


def _ours_put(src: Source, consumer: str, uid: str, resources: dict[str, int],
              generation: int | None) -> bool:
    try:
        set_allocations(src, [ConsumerRequest(consumer, {uid: resources}, "p", "u", generation, True,
                                              "INSTANCE")])
    except PlacementConflict as exc:
        assert "Unable to allocate inventory" in str(exc), exc
        return False
    return True


amounts = st.fixed_dictionaries({"VCPU": st.integers(0, 9),
                                 "MEMORY_MB": st.sampled_from([0, 512, 1024, 1536, 2048, 3072]),
                                 "VGPU": st.integers(0, 3)})


def _nonzero(resources: dict[str, int]) -> dict[str, int]:
    return {rc: n for rc, n in resources.items() if n}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cpu=st.integers(2, 8), ratio=st.sampled_from([1.0, 1.5, 2.0]), reserved=st.integers(0, 1),
       step=st.sampled_from([1, 1, 2]), vgpus=st.integers(0, 3), fill=amounts, old=amounts, new=amounts)
def test_a_running_instances_changed_allocation_is_taken_exactly_when_real_placement_takes_it(
        cpu: int, ratio: float, reserved: int, step: int, vgpus: int, fill: dict[str, int],
        old: dict[str, int], new: dict[str, int]) -> None:
    """Random host sizes, overcommit, reserves, steps and fills; a consumer's
    allocation `old`, its instance then running with libvirt counting exactly
    its vCPUs and memory, then its allocation changed to `new`: hvfleet takes
    each PUT exactly when real Placement 16.0 does, with the same inventories
    (usage − old + new ≤ capacity, max_unit, min_unit, step_size), and their
    usages agree after each."""
    store = _store()
    name = f"hv-diff-{next(_names)}"
    put_host(store, host(name, {"cpu": cpu, "memory": "4Gi"}, reserved={"cpu": reserved},
                         extra={"VGPU": vgpus} if vgpus else None, overcommit={"cpu": ratio},
                         annotations={"scheduling.hvfleet.io/step-size.cpu": str(step)},
                         beat=datetime.now(UTC)))
    h = store.get_hypervisor(name)
    uid = _uuid(store, name)
    inventories = export_inventories(h, [])
    real.load(real.Fleet([real.ProviderSpec(uid, name, None, {
        rc: Inventory(**fields) for rc, fields in inventories.items()})]))
    src = Source(store)
    filler, vm = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        _compare(store, src, name, uid, inventories, filler, vm, fill, old, new)
    finally:
        for c in (filler, vm):
            real.call("DELETE", f"/allocations/{c}")


def _compare(store: Store, src: Source, name: str, uid: str, inventories: dict[str, Any], filler: str,
             vm: str, fill: dict[str, int], old: dict[str, int], new: dict[str, int]) -> None:
    fill, old, new = _nonzero(fill), _nonzero(old), _nonzero(new)
    if fill:
        taken = _real_put(filler, uid, fill, None)
        assert _ours_put(src, filler, uid, fill, None) == taken, (inventories, fill)
    if not old:
        return
    taken = _real_put(vm, uid, old, None)
    assert _ours_put(src, vm, uid, old, None) == taken, (inventories, fill, old)
    if not taken:
        return
    _boots(store, name, vm, old.get("VCPU", 0), old.get("MEMORY_MB", 0))
    if not new:
        return
    taken = _real_put(vm, uid, new, 1)
    assert _ours_put(src, vm, uid, new, 1) == taken, (inventories, fill, old, new)
    # hvfleet counts the instance once, and at least as libvirt runs it: a
    # shrink not yet applied to the domain still counts the old size.
    now = new if taken else old
    theirs = real.ok("GET", f"/resource_providers/{uid}/usages")["usages"]
    expected = {rc: theirs.get(rc, 0) + (max(0, old.get(rc, 0) - now.get(rc, 0))
                                         if rc in ("VCPU", "MEMORY_MB") else 0) for rc in theirs}
    assert Source(store).fleet().providers[uid].usages == {rc: n for rc, n in expected.items() if n}
