"""Resources the agent does not discover (VGPU, CUSTOM_NIC_VF, anything libvirt
does not report) keep holding space for as long as the claim's instance exists
on that host, and stop when it is gone: in free capacity, describe, capacity,
fit, claims, the Placement export and gc. Through the real `hvfleet` entry
point on a real SQLite store."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sched_fleet import host, now, put_host

from hvfleet.model import Quantity, Reservation, ResourceName
from hvfleet.model.capacity import discovered_resources, free_capacity, held_resources, reservation_phase
from hvfleet.model.hypervisor import Hypervisor, Instance
from hvfleet.scheduling.claims import reserve
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import parse_request
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager

VM = "00000000-0000-0000-0000-00000000a001"
VM2 = "00000000-0000-0000-0000-00000000a002"
VGPU = ResourceName("VGPU")
NIC_VF = ResourceName("CUSTOM_NIC_VF")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path}/hvfleet.db"
    monkeypatch.setenv("HVFLEET_STORE", url)
    s = open_store(url)
    put_host(
        s,
        host("gpu-01", {"cpu": 16, "memory": "64Gi"}, extra={"VGPU": 8, "CUSTOM_NIC_VF": 4}, beat=now()),
    )
    yield s
    s.close()


def _agent_sees(store: Store, running: bool) -> None:
    """The agent's next status: the VM's domain with its cpu and memory, or not."""

    def observe(h: Hypervisor) -> Hypervisor:
        resources = {ResourceName("cpu"): Quantity(4), ResourceName("memory"): Quantity.parse("8Gi")}
        vm = Instance(uuid=VM, name="gpu-vm", state="running", resources=resources)
        status = h.status.model_copy(update={
            "instances": [vm] if running else [],
            "allocation": {
                ResourceName("cpu"): Quantity(4 if running else 0),
                ResourceName("memory"): Quantity.parse("8Gi" if running else "0"),
            },
            "last_heartbeat_time": now(),
        })
        return h.model_copy(update={"status": status})

    store.update_hypervisor("gpu-01", observe, agent_manager("gpu-01"))


def _free(run: Any) -> dict[str, str]:
    doc = json.loads(run("capacity", "-o", "json").out)
    return doc["hosts"][0]["free"]  # type: ignore[no-any-return]


def test_vgpu_and_vfs_stay_held_while_the_instance_runs_and_free_when_it_is_gone(
    store: Store, run: Any
) -> None:
    r = run("reserve", "gpu-01", "--cpu", "4", "--memory", "8Gi", "--resource", "VGPU=2",
            "--resource", "CUSTOM_NIC_VF=1", "--consumer", VM, "--ttl", "0")
    assert r.code == 0, r.err
    name = r.out.strip()
    assert _free(run) == {"CUSTOM_NIC_VF": "3", "VGPU": "6", "cpu": "12", "memory": "56Gi"}

    _agent_sees(store, running=True)
    # cpu and memory are now in libvirt's allocation; VGPU and the VF are not,
    # so the reservation keeps holding them (and only them).
    assert _free(run) == {"CUSTOM_NIC_VF": "3", "VGPU": "6", "cpu": "12", "memory": "56Gi"}
    describe = run("describe", "hypervisor", "gpu-01").out
    vgpu = next(line for line in describe.splitlines() if line.startswith("VGPU "))
    assert vgpu.split()[7] == "6"  # FREE
    doc = json.loads(run("reservations", "-o", "json").out)
    assert doc["items"][0]["status"]["phase"] == "Confirmed"
    listed = run("reservations").out.splitlines()
    header, row = listed[0].split(), listed[1].split()
    assert row[header.index("PHASE")] == "Confirmed"
    assert row[header.index("HOLDS")] == "CUSTOM_NIC_VF=1,VGPU=2"
    got = run("get", "reservations").out.splitlines()[1].split()
    assert got[4:6] == ["Confirmed", "CUSTOM_NIC_VF=1,VGPU=2"]

    fit = json.loads(run("fit", "--cpu", "1", "--resource", "VGPU=7", "-o", "json").out)
    assert fit["candidates"] == []
    fit = json.loads(run("fit", "--cpu", "1", "--resource", "VGPU=6", "-o", "json").out)
    assert [c["name"] for c in fit["candidates"]] == ["gpu-01"]
    assert run("reserve", "gpu-01", "--cpu", "1", "--resource", "VGPU=7", "--consumer", VM2).code == 3

    export = json.loads(run("placement", "export", "-o", "json").out)
    assert export["resource_providers"][0]["usages"] == {
        "CUSTOM_NIC_VF": 1, "MEMORY_MB": 8192, "VCPU": 4, "VGPU": 2}

    # gc keeps it while it holds space, and records that the instance showed up.
    assert run("reservations", "gc").out == ""
    assert store.get("Reservation", name).status.phase == "Confirmed"  # type: ignore[union-attr]

    _agent_sees(store, running=False)
    assert _free(run) == {"CUSTOM_NIC_VF": "4", "VGPU": "8", "cpu": "16", "memory": "64Gi"}
    export = json.loads(run("placement", "export", "-o", "json").out)
    assert export["resource_providers"][0]["usages"] == {}
    assert run("reservations", "gc").out.strip() == f"{name} Confirmed deleted"


def test_what_the_agent_discovers_is_what_it_reports_for_the_host() -> None:
    h = host("a", {"cpu": 8, "memory": "8Gi", "hugepages-2Mi": "1Gi"}, extra={"VGPU": 2},
             allocation={"hugepages-1Gi": "1Gi"}, instances=["vm"], beat=now())
    assert discovered_resources(h) == {"cpu", "memory", "hugepages-2Mi", "hugepages-1Gi"}
    from sched_fleet import reservation

    r = reservation("r", "a", {"cpu": 2, "VGPU": 1, "disk": "10Gi"}, consumer="vm")
    assert held_resources(r, h, now()) == {VGPU: Quantity(1), ResourceName("disk"): Quantity.parse("10Gi")}
    assert free_capacity(h, [r], now())[VGPU] == 1
    index = FleetIndex()
    index.load([h], [r], now=now())
    assert index.free("a")[VGPU] == 1
    assert index.fit(parse_request("1", None, ["VGPU=2"])).names == []
    assert index.fit(parse_request("1", None, ["VGPU=1"])).names == ["a"]


def test_placement_sync_keeps_the_mirror_of_a_running_instance_with_a_vgpu(
    store: Store, run: Any
) -> None:
    from real_placement import RealPlacement

    doc = json.loads(run("placement", "export", "-o", "json").out)
    [rp] = doc["resource_providers"]
    other = "00000000-0000-0000-0000-00000000a002"  # cpu and memory only
    with RealPlacement() as p:
        c = p.client("1.27")
        c.request("PUT", "/resource_classes/CUSTOM_NIC_VF", expect=(201, 204))
        c.request("POST", "/resource_providers", {"name": rp["name"], "uuid": rp["uuid"]})
        inventories = {k: v for k, v in rp["inventories"].items() if k in ("VCPU", "MEMORY_MB")}
        c.request("PUT", f"/resource_providers/{rp['uuid']}/inventories",
                  {"resource_provider_generation": 0, "inventories": inventories})
        gpu = "00000000-0000-0000-0000-0000000000f0"
        c.request("POST", "/resource_providers",
                  {"name": "gpu-01-pgpu0", "uuid": gpu, "parent_provider_uuid": rp["uuid"]})
        c.request("PUT", f"/resource_providers/{gpu}/inventories",
                  {"resource_provider_generation": 0,
                   "inventories": {"VGPU": rp["inventories"]["VGPU"]}})
        for consumer, gpus in ((VM, 2), (other, 0)):
            allocations: dict[str, Any] = {rp["uuid"]: {"resources": {"VCPU": 4, "MEMORY_MB": 8192}}}
            if gpus:
                allocations[gpu] = {"resources": {"VGPU": gpus}}
            c.request("PUT", f"/allocations/{consumer}",
                      {"allocations": allocations, "project_id": "p", "user_id": "u"})

        def sync() -> dict[str, Any]:
            r = run("placement", "sync", "--url", p.url, "-o", "json")
            assert r.code == 0, r.err
            return json.loads(r.out)  # type: ignore[no-any-return]

        assert len(sync()["created"]) == 2
        assert _free(run)["VGPU"] == "6"
        # libvirt shows both instances now.
        def both_run(h: Hypervisor) -> Hypervisor:
            vms = [Instance(uuid=u, name=u[-4:], state="running") for u in (VM, other)]
            status = h.status.model_copy(update={
                "instances": vms,
                "allocation": {
                    ResourceName("cpu"): Quantity(8), ResourceName("memory"): Quantity.parse("16Gi")},
            })
            return h.model_copy(update={"status": status})

        store.update_hypervisor("gpu-01", both_run, agent_manager("gpu-01"))
        report = sync()
        # The cpu-and-memory-only mirror goes (the allocation counts all of it);
        # the vGPU one stays, whole, and holds only its VGPU.
        assert len(report["deleted"]) == 1 and report["unchanged"] == 1
        [mirror] = store.list_reservations()
        assert mirror.spec.consumer == VM and mirror.spec.resources[VGPU] == 2
        assert _free(run) == {"CUSTOM_NIC_VF": "4", "VGPU": "6", "cpu": "8", "memory": "48Gi"}
        usages = json.loads(run("placement", "export", "-o", "json").out)["resource_providers"][0]["usages"]
        theirs = c.get(f"/resource_providers/{rp['uuid']}/usages")["usages"]
        theirs_gpu = c.get(f"/resource_providers/{gpu}/usages")["usages"]
        assert usages == {
            "MEMORY_MB": theirs["MEMORY_MB"], "VCPU": theirs["VCPU"], "VGPU": theirs_gpu["VGPU"]}
        assert sync()["unchanged"] == 1
        # The instance is deleted: nova drops its allocation, libvirt its domain.
        c.request("DELETE", f"/allocations/{VM}")
        _agent_sees(store, running=False)
        assert len(sync()["deleted"]) == 1
        assert _free(run)["VGPU"] == "8"


def test_placement_sync_keeps_what_a_listed_instances_mirror_holds_beyond_libvirts_count(
    store: Store, run: Any
) -> None:
    """A mirror stays for as long as its claim holds something
    (`beyond_libvirt`), not only while it has a resource libvirt cannot see:
    a resize not yet applied to the domain, or a shut-off instance that the
    allocation leaves out (`--count running`). Free capacity and the usages
    then agree with real Placement's; once libvirt counts it all, it goes."""
    from real_placement import RealPlacement

    doc = json.loads(run("placement", "export", "-o", "json").out)
    [rp] = doc["resource_providers"]
    resized, stopped, plain = VM, VM2, "00000000-0000-0000-0000-00000000a003"
    asked = {resized: (8, 8192), stopped: (2, 2048), plain: (2, 2048)}  # VCPU, MEMORY_MB
    with RealPlacement() as p:
        c = p.client("1.27")
        c.request("POST", "/resource_providers", {"name": rp["name"], "uuid": rp["uuid"]})
        inventories = {k: v for k, v in rp["inventories"].items() if k in ("VCPU", "MEMORY_MB")}
        c.request("PUT", f"/resource_providers/{rp['uuid']}/inventories",
                  {"resource_provider_generation": 0, "inventories": inventories})
        for consumer, (vcpu, mb) in asked.items():
            c.request("PUT", f"/allocations/{consumer}", {
                "allocations": {rp["uuid"]: {"resources": {"VCPU": vcpu, "MEMORY_MB": mb}}},
                "project_id": "p", "user_id": "u"})

        def sync() -> dict[str, Any]:
            r = run("placement", "sync", "--url", p.url, "-o", "json")
            assert r.code == 0, r.err
            return json.loads(r.out)  # type: ignore[no-any-return]

        def agent_sees(resized_cpus: int, stopped_state: str) -> None:
            """The agent's status under --count running: `resized` runs with
            `resized_cpus` vCPUs, `stopped` is in `stopped_state`, `plain` runs
            as allocated."""
            def observe(h: Hypervisor) -> Hypervisor:
                def vm(uuid: str, state: str, cpus: int, gib: int) -> Instance:
                    return Instance(uuid=uuid, name=uuid[-4:], state=state, resources={
                        ResourceName("cpu"): Quantity(cpus), ResourceName("memory"): Quantity(gib * 2**30)})
                vms = [vm(resized, "running", resized_cpus, 8), vm(stopped, stopped_state, 2, 2),
                       vm(plain, "running", 2, 2)]
                counted = [i for i in vms if i.state == "running"]
                allocation = {r: Quantity(sum(i.resources[r].floor() for i in counted))
                              for r in (ResourceName("cpu"), ResourceName("memory"))}
                status = h.status.model_copy(update={
                    "instances": vms, "allocation": allocation, "count_mode": "running",
                    "last_heartbeat_time": now()})
                return h.model_copy(update={"status": status})

            store.update_hypervisor("gpu-01", observe, agent_manager("gpu-01"))

        def usages_agree() -> dict[str, Any]:
            ours = json.loads(run("placement", "export", "-o", "json").out)["resource_providers"][0]["usages"]
            theirs = c.get(f"/resource_providers/{rp['uuid']}/usages")["usages"]
            core = ("VCPU", "MEMORY_MB")
            assert {k: ours[k] for k in core} == {k: theirs[k] for k in core}, (ours, theirs)
            return {k: theirs[k] for k in core}

        assert len(sync()["created"]) == 3
        # libvirt shows the three: the resize to 8 vCPUs is not applied yet
        # (the domain has 4), the stopped one is shut off, the plain one runs.
        agent_sees(resized_cpus=4, stopped_state="shutoff")
        report = sync()
        assert len(report["deleted"]) == 1, report  # the plain one: libvirt counts all of it
        kept = {r.spec.consumer: r for r in store.list_reservations()}
        assert set(kept) == {resized, stopped}, kept
        assert held_resources(kept[resized], store.get_hypervisor("gpu-01"), now()) == {
            ResourceName("cpu"): Quantity(4)}
        assert held_resources(kept[stopped], store.get_hypervisor("gpu-01"), now()) == {
            ResourceName("cpu"): Quantity(2), ResourceName("memory"): Quantity(2 * 2**30)}
        # 16 cpus − 6 counted by libvirt − 4 (the resize) − 2 (the stopped one).
        assert _free(run)["cpu"] == "4" and _free(run)["memory"] == "52Gi", _free(run)
        assert usages_agree() == {"VCPU": 12, "MEMORY_MB": 12288}
        assert sync()["unchanged"] == 2
        # The resize is applied and the stopped one starts: libvirt counts all.
        agent_sees(resized_cpus=8, stopped_state="running")
        assert len(sync()["deleted"]) == 2
        assert store.list_reservations() == []
        assert _free(run)["cpu"] == "4" and _free(run)["memory"] == "52Gi", _free(run)
        assert usages_agree() == {"VCPU": 12, "MEMORY_MB": 12288}


def test_releasing_a_recorded_confirmed_claim_frees_its_vgpu(store: Store, run: Any) -> None:
    name = run("reserve", "gpu-01", "--cpu", "4", "--memory", "8Gi", "--resource", "VGPU=2",
               "--consumer", VM).out.strip()
    _agent_sees(store, running=True)
    run("reservations", "gc")
    assert store.get("Reservation", name).status.phase == "Confirmed"  # type: ignore[union-attr]
    assert _free(run)["VGPU"] == "6"
    assert run("release", name).out.strip() == f"{name} Released"
    assert _free(run)["VGPU"] == "8"


def test_an_expired_claim_whose_instance_appears_is_confirmed_and_may_overcommit_the_host(
        store: Store, run: Any) -> None:
    # A deliberate choice (docs/scheduling.md, "Free capacity and phases"): the
    # instance is real and uses what it claimed, so the host's picture shows
    # its VGPU, overcommitted, rather than hide what a running instance uses.
    late = reserve(store, "gpu-01", parse_request("1", None, ["VGPU=1"]), VM,
                   ttl=timedelta(milliseconds=1))
    time.sleep(0.01)
    assert json.loads(run("reservations", "-o", "json").out)["items"][0]["status"]["phase"] == "Expired"
    assert _free(run)["VGPU"] == "8"
    taken = run("reserve", "gpu-01", "--resource", "VGPU=8", "--consumer", VM2, "--ttl", "0")
    assert taken.code == 0, taken.err

    _agent_sees(store, running=True)  # the expired claim's instance shows up after all
    h = store.get_hypervisor("gpu-01")
    claim = store.get_as(Reservation, late.name)
    assert reservation_phase(claim, h, now()) == "Confirmed"
    assert held_resources(claim, h, now()) == {VGPU: Quantity(1)}  # libvirt counts its cpu
    phases = {i["metadata"]["name"]: i["status"]["phase"]
              for i in json.loads(run("reservations", "-o", "json").out)["items"]}
    assert phases[late.name] == "Confirmed"
    assert _free(run)["VGPU"] == "-1"  # 8 − 8 − 1: overcommitted, and said so
    fit = run("fit", "--resource", "VGPU=1", "-o", "json")
    assert fit.code == 3 and json.loads(fit.out)["candidates"] == []
    assert run("reserve", "gpu-01", "--resource", "VGPU=1", "--consumer", str(uuid.uuid4())).code == 3
