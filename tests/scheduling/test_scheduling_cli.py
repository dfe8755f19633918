"""The scheduling commands through the real `hvfleet` entry point, on a real
SQLite store, and `placement export|sync` against a real Placement."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_placement import RealPlacement
from sched_fleet import host, now, put_host

from hvfleet.model import ResourceName
from hvfleet.model.capacity import free_capacity
from hvfleet.model.hypervisor import Instance
from hvfleet.scheduling.placement_client import PlacementClient
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager

CPU = ResourceName("cpu")




@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path}/hvfleet.db"
    monkeypatch.setenv("HVFLEET_STORE", url)
    s = open_store(url)
    put_host(
        s, host("hv-a", {"cpu": 8, "memory": "32Gi"}, allocation={"cpu": 4}, beat=now(), labels={"zone": "x"})
    )
    put_host(
        s,
        host(
            "hv-b",
            {"cpu": 8, "memory": "32Gi"},
            beat=now(),
            labels={"zone": "y"},
            instances=["00000000-0000-0000-0000-0000000000c3"],
        ),
    )
    put_host(s, host("hv-c", {"cpu": 64, "memory": "256Gi"}, maintenance="manual", beat=now()))
    yield s
    s.close()




def test_fit_ranks_candidates_and_explains_rejections(store: Store, run: Any) -> None:
    r = run("fit", "--cpu", "4", "--memory", "8Gi", "-o", "json", "--why")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert [c["name"] for c in doc["candidates"]] == ["hv-a", "hv-b"]  # binpack: fuller first
    assert doc["candidates"][0]["free"] == {"cpu": "4", "memory": "32Gi"}
    assert doc["rejected"]["hv-c"][0]["reason"] == "maintenance"
    r = run("fit", "--cpu", "6", "-o", "json", "--why", "--weigher", "spread")
    doc = json.loads(r.out)
    assert [c["name"] for c in doc["candidates"]] == ["hv-b"]
    [why] = doc["rejected"]["hv-a"]
    assert (why["reason"], why["resource"], why["requested"], why["available"], why["shortBy"]) == (
        "insufficient",
        "cpu",
        "6",
        "4",
        "2",
    )
    r = run("fit", "--cpu", "1", "-l", "zone=y", "--limit", "1")
    assert r.code == 0 and r.out.splitlines()[1].startswith("hv-b")
    assert run("fit", "--cpu", "1", "--resource", "gpu=1").code == 2
    assert run("fit", "--cpu", "1", "--limit", "0").code == 2


def test_reserve_release_list_and_gc(store: Store, run: Any) -> None:
    consumer = str(uuid.uuid4())
    r = run("reserve", "hv-a", "--cpu", "4", "--memory", "1Gi", "--consumer", consumer)
    assert r.code == 0, r.err
    name = r.out.strip()
    r = run("reserve", "hv-a", "--cpu", "1", "--consumer", str(uuid.uuid4()))
    assert r.code == 3
    assert r.err.startswith("error: does not fit on hv-a: cpu: needs 1, 0 free")
    assert len(r.err.strip().splitlines()) == 1
    r = run("reserve", "--auto", "--cpu", "2", "--consumer", str(uuid.uuid4()), "--ttl", "1h")
    assert r.code == 0 and store.get("Reservation", r.out.strip()).spec.hypervisor == "hv-b"  # type: ignore[union-attr]
    assert run("reserve", "hv-a", "--auto", "--cpu", "1", "--consumer", "x").code == 2
    assert run("reserve", "hv-a", "--cpu", "1").code == 2
    assert run("reserve", "hv-a", "--cpu", "1", "--consumer", str(uuid.uuid4()), "--ttl", "soon").code == 2
    doc = json.loads(run("reservations", "-o", "json").out)
    assert {i["spec"]["hypervisor"] for i in doc["items"]} == {"hv-a", "hv-b"}
    assert {i["status"]["phase"] for i in doc["items"]} == {"Active"}
    assert yaml.safe_load(run("reservations", "-o", "yaml").out) == doc
    assert run("release", name).out.strip() == f"{name} Released"
    table = run("reservations", "-l", "hvfleet.io/hypervisor=hv-a").out
    assert "Released" in table and "hv-b" not in table
    r = run("reservations", "gc")
    assert r.out.strip() == f"{name} Released deleted"
    assert run("release", "nope").code == 1
    free = free_capacity(store.get_hypervisor("hv-a"), store.list_reservations(), now())
    assert free[CPU] == 4


def test_reservations_lists_live_claims_on_a_deleted_host(store: Store, run: Any) -> None:
    # Deleting a host leaves its claims in the store; they hold again when it
    # registers again, so the listing must not hide them.
    consumer = str(uuid.uuid4())
    name = run("reserve", "hv-a", "--cpu", "3", "--consumer", consumer, "--ttl", "0").out.strip()
    run("reserve", "hv-b", "--cpu", "1", "--consumer", str(uuid.uuid4()))
    assert run("delete", "hypervisor", "hv-a").code == 0
    r = run("reservations")
    assert r.code == 0, r.err
    header, *rows = (line.split() for line in r.out.splitlines())
    row = next(row for row in rows if row[0] == name)
    assert row[header.index("HYPERVISOR")] == "hv-a" and row[header.index("PHASE")] == "Active"
    assert f"reservation {name} is on hypervisor hv-a, which does not exist" in r.err
    doc = json.loads(run("reservations", "-o", "json").out)
    assert sorted(i["spec"]["hypervisor"] for i in doc["items"]) == ["hv-a", "hv-b"]
    on_a = json.loads(run("reservations", "-o", "json", "-l", "hvfleet.io/hypervisor=hv-a").out)
    assert [i["metadata"]["name"] for i in on_a["items"]] == [name]
    # Only a host selector asks for hosts that exist (and match it).
    by_labels = json.loads(run("reservations", "-o", "json", "--hypervisor-selector", "zone").out)
    assert [i["spec"]["hypervisor"] for i in by_labels["items"]] == ["hv-b"]


@pytest.fixture(scope="module")
def placement() -> Iterator[RealPlacement]:
    with RealPlacement() as p:
        yield p


def _load_export_into_placement(c: PlacementClient, doc: dict[str, Any]) -> None:
    """Create providers exactly as exported; usages as allocations no larger than max_unit."""
    c.microversion = "1.27"
    for rp in doc["resource_providers"]:
        c.request("PUT", "/resource_classes/CUSTOM_NIC_VF", expect=(201, 204))
        c.request("POST", "/resource_providers", {"name": rp["name"], "uuid": rp["uuid"]})
        c.request(
            "PUT",
            f"/resource_providers/{rp['uuid']}/inventories",
            {"resource_provider_generation": 0, "inventories": rp["inventories"]},
        )
        left = dict(rp["usages"])
        while any(left.values()):
            chunk = {k: min(v, rp["inventories"][k]["max_unit"]) for k, v in left.items() if v}
            c.request(
                "PUT",
                f"/allocations/{uuid.uuid4()}",
                {"allocations": {rp["uuid"]: {"resources": chunk}}, "project_id": "p", "user_id": "u"},
            )
            left = {k: v - chunk.get(k, 0) for k, v in left.items()}


def test_export_is_what_placement_accepts_and_agrees_with_fit(
    store: Store, run: Any, placement: RealPlacement
) -> None:
    put_host(
        store,
        host(
            "hv-d",
            {"cpu": 10, "memory": "10Gi", "CUSTOM_NIC_VF": 4},
            reserved={"cpu": 2, "memory": "1536Mi"},
            overcommit={"cpu": 0.75, "memory": 2.0},
            allocation={"cpu": 2, "memory": "1Gi"},
            beat=now(),
            annotations={"scheduling.hvfleet.io/step-size.cpu": "2"},
        ),
    )
    assert run("reserve", "hv-d", "--cpu", "2", "--consumer", str(uuid.uuid4())).code == 0
    doc = json.loads(run("placement", "export", "-o", "json", "-l", "zone notin (nowhere)").out)
    by_name = {rp["name"]: rp for rp in doc["resource_providers"]}
    assert by_name["hv-d"]["inventories"] == {
        "CUSTOM_NIC_VF": {
            "total": 4,
            "reserved": 0,
            "min_unit": 1,
            "max_unit": 4,
            "step_size": 1,
            "allocation_ratio": 1.0,
        },
        "MEMORY_MB": {
            "total": 10240,
            "reserved": 1536,
            "min_unit": 1,
            "max_unit": 8704,
            "step_size": 1,
            "allocation_ratio": 2.0,
        },
        "VCPU": {
            "total": 10,
            "reserved": 2,
            "min_unit": 1,
            "max_unit": 8,
            "step_size": 2,
            "allocation_ratio": 0.75,
        },
    }
    assert by_name["hv-d"]["usages"] == {"VCPU": 4, "MEMORY_MB": 1024}
    # hv-c is in maintenance: Placement cannot express that, so compare the rest.
    del by_name["hv-c"]
    doc["resource_providers"] = list(by_name.values())
    c = placement.client()
    _load_export_into_placement(c, doc)
    asks = {
        "VCPU:1": ["--cpu", "1"],
        "VCPU:2": ["--cpu", "2"],
        "VCPU:4": ["--cpu", "4"],
        "VCPU:2,MEMORY_MB:7168": ["--cpu", "2", "--memory", "7Gi"],
        "VCPU:1,CUSTOM_NIC_VF:4": ["--cpu", "1", "--resource", "CUSTOM_NIC_VF=4"],
        "MEMORY_MB:8704": ["--memory", "8704Mi"],
        "MEMORY_MB:8705": ["--memory", "8705Mi"],
    }
    seen: dict[str, set[str]] = {}
    for query, ask in asks.items():
        mine = {x["name"] for x in json.loads(run("fit", *ask, "-o", "json").out)["candidates"]}
        out = c.get(f"/allocation_candidates?resources={query}")
        theirs = {doc_name(doc, u) for u in out["provider_summaries"]}
        assert mine == theirs, query
        seen[query] = mine
    # Both agree, and the cases mean something: step_size, max_unit, overcommit < 1.
    assert "hv-d" in seen["MEMORY_MB:8704"] and "hv-d" not in seen["MEMORY_MB:8705"]
    assert "hv-d" in seen["VCPU:2"] and "hv-d" not in seen["VCPU:1"]
    assert "hv-d" not in seen["VCPU:4"]  # (10 − 2) × 0.75 = 6, 4 used


def doc_name(doc: dict[str, Any], u: str) -> str:
    return next(rp["name"] for rp in doc["resource_providers"] if rp["uuid"] == u)


def test_placement_sync_mirrors_promised_space_until_libvirt_shows_it(store: Store, run: Any) -> None:
    doc = json.loads(run("placement", "export", "-o", "json").out)
    with RealPlacement() as p:
        c = p.client("1.27")
        _load_export_into_placement(
            c,
            {
                "resource_providers": [
                    # Inventories only: what libvirt already shows has no Placement consumer here.
                    {**rp, "usages": {}}
                    for rp in doc["resource_providers"]
                    if rp["name"] in ("hv-a", "hv-b")
                ]
                + [
                    {
                        "name": "stranger",
                        "uuid": str(uuid.uuid4()),
                        "inventories": {"VCPU": {"total": 4}},
                        "usages": {},
                    }
                ]
            },
        )
        uid = {rp["name"]: rp["uuid"] for rp in doc["resource_providers"]}
        c1 = "00000000-0000-0000-0000-0000000000c1"
        c2 = "00000000-0000-0000-0000-0000000000c2"
        c3 = "00000000-0000-0000-0000-0000000000c3"  # hv-b's libvirt already runs it

        def allocate(consumer: str, hv: str, resources: dict[str, int], **more: Any) -> None:
            allocations = {uid[hv]: {"resources": resources}, **more}
            body = {"allocations": allocations, "project_id": "p", "user_id": "u"}
            c.request("PUT", f"/allocations/{consumer}", body)

        # A vGPU on a nested provider under hv-a's compute node, as nova reports it.
        gpu = str(uuid.uuid4())
        c.request(
            "POST",
            "/resource_providers",
            {"name": "hv-a-pgpu0", "uuid": gpu, "parent_provider_uuid": uid["hv-a"]},
        )
        c.request(
            "PUT",
            f"/resource_providers/{gpu}/inventories",
            {"resource_provider_generation": 0, "inventories": {"VGPU": {"total": 4}}},
        )
        allocate(c1, "hv-a", {"VCPU": 2, "MEMORY_MB": 1024}, **{gpu: {"resources": {"VGPU": 1}}})
        allocate(c2, "hv-b", {"VCPU": 1})
        allocate(c3, "hv-b", {"VCPU": 1})

        def sync() -> dict[str, Any]:
            r = run("placement", "sync", "--url", p.url, "-o", "json")
            assert r.code == 0, r.err
            return json.loads(r.out)  # type: ignore[no-any-return]

        report = sync()
        assert (len(report["created"]), report["unknownProviders"]) == (2, ["stranger"])
        mirrors = {r.spec.consumer: r for r in store.list_reservations()}
        assert set(mirrors) == {c1, c2}
        assert mirrors[c1].spec.source == "placement" and mirrors[c1].spec.hypervisor == "hv-a"
        assert {str(k): str(v) for k, v in mirrors[c1].spec.resources.items()} == {
            "cpu": "2",
            "memory": "1Gi",
            "VGPU": "1",
        }
        free = free_capacity(store.get_hypervisor("hv-a"), store.list_reservations(), now())
        assert free[CPU] == 2  # 8 − 4 allocated − 2 promised by Placement
        assert sync() == {
            "created": [],
            "updated": [],
            "deleted": [],
            "unchanged": 2,
            "unknownProviders": ["stranger"],
            "resourceClasses": {"created": [], "existing": 0},  # no CUSTOM_* class in this fleet
            # Loaded from the export: Placement already holds hvfleet's inventories.
            "inventories": {"updated": [], "unchanged": 2, "retries": 0, "missingProviders": ["hv-c"]},
            "errors": [],
        }
        c.request("DELETE", f"/allocations/{c1}")
        allocate(c1, "hv-a", {"VCPU": 3, "MEMORY_MB": 1024})
        c.request("DELETE", f"/allocations/{c2}")
        report = sync()
        assert (len(report["updated"]), len(report["deleted"]), report["unchanged"]) == (1, 1, 0)
        # libvirt now shows c1 on hv-a: the allocation counts it, the mirror goes.
        h = store.get_hypervisor("hv-a")
        vm = Instance(uuid=c1, name="vm-c1", state="running")
        status = h.status.model_copy(update={"instances": [*h.status.instances, vm]})
        store.update(h.model_copy(update={"status": status}), agent_manager("hv-a"))
        assert len(sync()["deleted"]) == 1
        assert store.list_reservations() == []
