"""hvfleet's Placement API over the fleet's own objects, through a real
`hvfleet serve` (HTTPS, real tokens): a Hypervisor is a root provider whose
inventories are the ones `placement export` computes, an allocation on it is a
claim (a Reservation `hvfleet reservations` lists), an `hvfleet reserve` is a
Placement allocation, the policy table holds per role, and 8 concurrent
clients never overbook, on SQLite and on etcd."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hvfleet.model.hypervisor import Condition, Hypervisor, OvercommitPolicy, OvercommitPolicySpec
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.placement import candidates
from hvfleet.placement.records import Source
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.scheduling.placement import export_inventories
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from tests.placement.support import (
    Placement,
    _claim,
    _fleet,
    _race,
    _serve,
    _served_sqlite,
    _stored_provider,
    _uuid,
)
from tests.scheduling.sched_fleet import host, put_host
from tests.support.etcd_local import EtcdCluster


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    yield from _served_sqlite()


def test_a_hypervisor_is_a_root_provider_with_the_inventories_placement_export_computes(
        api: Placement) -> None:
    hv1 = api.store.get_hypervisor("hv1")
    rps = api.call("GET", "/resource_providers?name=hv1").json()["resource_providers"]
    assert [(p["uuid"], p["name"], p["parent_provider_uuid"], p["root_provider_uuid"]) for p in rps] == [
        (hv1.metadata.uid, "hv1", None, hv1.metadata.uid)]
    inv = api.call("GET", f"/resource_providers/{hv1.metadata.uid}/inventories").json()["inventories"]
    assert inv == export_inventories(hv1, api.store.list_overcommit_policies())
    assert inv["VCPU"]["allocation_ratio"] == 2.0 and inv["VCPU"]["total"] == 16


def test_a_put_of_a_hypervisor_inventory_is_a_noop_when_it_agrees_and_refused_otherwise(
        api: Placement) -> None:
    uid = _uuid(api.store, "hv2")
    doc = api.call("GET", f"/resource_providers/{uid}/inventories").json()
    same = api.call("PUT", f"/resource_providers/{uid}/inventories", body=doc)
    assert same.status_code == 200 and same.json() == doc
    doc["inventories"]["VCPU"]["total"] = 64
    other = api.call("PUT", f"/resource_providers/{uid}/inventories", body=doc)
    assert other.status_code == 409
    err = other.json()["errors"][0]
    assert err["code"] == "placement.concurrent_update" and "Hypervisor hv2" in err["detail"]
    assert api.call("GET", f"/resource_providers/{uid}/inventories").json()["inventories"]["VCPU"][
        "total"] == 8


def test_an_allocation_on_a_hypervisor_is_a_claim_the_cli_lists(
        api: Placement, run: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVFLEET_STORE", api.store.url)
    uid = _uuid(api.store, "hv1")
    consumer, project = str(uuid.uuid4()), str(uuid.uuid4())
    body = {"allocations": {uid: {"resources": {"VCPU": 4, "MEMORY_MB": 2048}}},
            "project_id": project, "user_id": str(uuid.uuid4()),
            "consumer_generation": None, "consumer_type": "INSTANCE"}
    assert api.call("PUT", f"/allocations/{consumer}", "scheduler", body).status_code == 204
    listed = json.loads(run("reservations", "-o", "json").out)
    mine = [r for r in listed["items"] if r["spec"]["consumer"] == consumer]
    assert [(r["spec"]["hypervisor"], r["spec"]["resources"]) for r in mine] == [
        ("hv1", {"cpu": "4", "memory": "2Gi"})]
    usages = api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]
    assert usages["VCPU"] == 4 and usages["MEMORY_MB"] == 2048
    got = api.call("GET", f"/allocations/{consumer}").json()
    assert got["allocations"][uid]["resources"] == {"VCPU": 4, "MEMORY_MB": 2048}
    assert got["consumer_generation"] == 1 and got["consumer_type"] == "INSTANCE"
    assert api.call("GET", f"/usages?project_id={project}").json()["usages"] == {
        "INSTANCE": {"consumer_count": 1, "VCPU": 4, "MEMORY_MB": 2048}}
    assert api.call("DELETE", f"/allocations/{consumer}", "scheduler").status_code == 204
    listed = json.loads(run("reservations", "-o", "json").out)
    assert not [r for r in listed["items"] if r["spec"]["consumer"] == consumer]


def test_an_hvfleet_reserve_shows_as_a_placement_allocation(
        api: Placement, run: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVFLEET_STORE", api.store.url)
    consumer = str(uuid.uuid4())
    uid = _uuid(api.store, "hv2")
    before = api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]
    r = run("reserve", "hv2", "--cpu", "2", "--memory", "1Gi", "--consumer", consumer)
    assert r.code == 0, r.err
    after = api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]
    grew = {rc: after[rc] - before.get(rc, 0) for rc in ("VCPU", "MEMORY_MB")}
    assert grew == {"VCPU": 2, "MEMORY_MB": 1024}
    got = api.call("GET", f"/allocations/{consumer}").json()
    assert got["allocations"] == {uid: {"resources": {"VCPU": 2, "MEMORY_MB": 1024},
                                        "generation": got["allocations"][uid]["generation"]}}
    on_rp = api.call("GET", f"/resource_providers/{uid}/allocations").json()["allocations"]
    assert on_rp[consumer] == {"resources": {"VCPU": 2, "MEMORY_MB": 1024}, "consumer_generation": 0}
    assert got["consumer_generation"] == 0


def test_a_put_naming_an_hvfleet_reserves_consumer_as_new_is_refused_and_one_with_its_generation_replaces_it(
        api: Placement, run: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer that has allocations has an integer generation in Placement
    (1.28 on): an `hvfleet reserve` claim's consumer (no Placement record)
    shows generation 0, a PUT that thinks it new (`null`) is Placement's 409
    and leaves the claim, and a PUT with 0 replaces it in one write."""
    monkeypatch.setenv("HVFLEET_STORE", api.store.url)
    consumer = str(uuid.uuid4())
    uid = _uuid(api.store, "hv2")
    assert run("reserve", "hv2", "--cpu", "2", "--memory", "1Gi", "--consumer", consumer,
               "--ttl", "0").code == 0
    got = api.call("GET", f"/allocations/{consumer}").json()
    assert got["consumer_generation"] == 0
    body = {"allocations": {uid: {"resources": {"VCPU": 1}}}, "project_id": str(uuid.uuid4()),
            "user_id": str(uuid.uuid4()), "consumer_generation": None, "consumer_type": "INSTANCE"}
    as_new = api.call("PUT", f"/allocations/{consumer}", "scheduler", body)
    assert as_new.status_code == 409, as_new.text
    assert as_new.json()["errors"][0]["code"] == "placement.concurrent_update"
    assert api.call("GET", f"/allocations/{consumer}").json()["allocations"][uid]["resources"] == {
        "VCPU": 2, "MEMORY_MB": 1024}
    body = {**body, "consumer_generation": 0}
    assert api.call("PUT", f"/allocations/{consumer}", "scheduler", body).status_code == 204
    after = api.call("GET", f"/allocations/{consumer}").json()
    assert after["allocations"][uid]["resources"] == {"VCPU": 1} and after["consumer_generation"] == 1
    held = [r for r in json.loads(run("reservations", "-o", "json").out)["items"]
            if r["spec"]["consumer"] == consumer]
    assert [r["spec"]["resources"] for r in held] == [{"cpu": "1"}]
    assert api.call("DELETE", f"/allocations/{consumer}", "scheduler").status_code == 204


def test_an_allocation_stays_as_made_when_its_instance_shows_in_libvirt_and_counts_once(
        api: Placement) -> None:
    """Nova's allocation of a booted instance is still its allocation: GET
    /allocations/{consumer}, the provider's allocations and the project's
    usages show it as made (Nova moves it on a migration, counts quota from
    it, deletes it with the instance), while the provider's usage counts the
    instance once (libvirt's allocation now has it; the claim holds only what
    libvirt cannot see, here nothing)."""
    from hvfleet.model.hypervisor import Instance

    put_host(api.store, host("hv-boot", {"cpu": 8, "memory": "8Gi"}, beat=datetime.now(UTC)))
    uid = _uuid(api.store, "hv-boot")
    consumer, project = str(uuid.uuid4()), str(uuid.uuid4())
    made = {"VCPU": 2, "MEMORY_MB": 1024}
    assert api.call("PUT", f"/allocations/{consumer}", "scheduler", {
        "allocations": {uid: {"resources": made}}, "project_id": project, "user_id": str(uuid.uuid4()),
        "consumer_generation": None, "consumer_type": "INSTANCE"}).status_code == 204
    before = api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]

    def boots(h: Hypervisor) -> Hypervisor:
        cpu, memory = ResourceName.parse("cpu"), ResourceName.parse("memory")
        used = {cpu: Quantity(2), memory: Quantity.parse("1Gi")}
        vm = Instance(uuid=consumer, name="vm", state="running", resources=used)
        return h.model_copy(update={"status": h.status.model_copy(update={
            "instances": [*h.status.instances, vm], "allocation": used})})

    api.store.update_hypervisor("hv-boot", boots, agent_manager("hv-boot"))
    assert api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"] == before == made
    got = api.call("GET", f"/allocations/{consumer}").json()
    assert {u: a["resources"] for u, a in got["allocations"].items()} == {uid: made}
    on_rp = api.call("GET", f"/resource_providers/{uid}/allocations").json()["allocations"]
    assert on_rp == {consumer: {"resources": made, "consumer_generation": 1}}
    assert api.call("GET", f"/usages?project_id={project}").json()["usages"] == {
        "INSTANCE": {"consumer_count": 1, **made}}
    # The same allocation PUT again (as Nova does around a port's bandwidth) changes no claim.
    claims = [r.name for r in api.store.list_reservations() if r.spec.consumer == consumer]
    assert api.call("PUT", f"/allocations/{consumer}", "scheduler", {
        "allocations": {uid: {"resources": made}}, "project_id": project, "user_id": got["user_id"],
        "consumer_generation": 1, "consumer_type": "INSTANCE"}).status_code == 204
    assert [r.name for r in api.store.list_reservations() if r.spec.consumer == consumer] == claims
    assert api.call("DELETE", f"/allocations/{consumer}", "scheduler").status_code == 204
    assert [r for r in api.store.list_reservations() if r.spec.consumer == consumer] == []
    assert api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"] == made  # libvirt's


def test_a_host_in_maintenance_carries_compute_status_disabled_so_novas_scheduler_skips_it(
        api: Placement) -> None:
    """nova-compute marks a disabled service's node with COMPUTE_STATUS_DISABLED
    and Nova's scheduler always asks for roots without it; a hypervisor hvfleet
    would refuse a claim on (maintenance, not Ready) carries it, computed, and
    loses it when it may take guests again."""
    put_host(api.store, host("hv-cordon", {"cpu": 64, "memory": "64Gi"}, beat=datetime.now(UTC)))
    uid = _uuid(api.store, "hv-cordon")
    nova = "/allocation_candidates?resources=VCPU:40&root_required=!COMPUTE_STATUS_DISABLED"

    def state() -> tuple[list[str], bool, bool]:
        traits = api.call("GET", f"/resource_providers/{uid}/traits").json()["traits"]
        offered = uid in api.call("GET", nova).json()["provider_summaries"]
        plain = api.call("GET", "/allocation_candidates?resources=VCPU:40").json()["provider_summaries"]
        return traits, offered, uid in plain

    assert state() == ([], True, True)

    def maintenance(value: str) -> None:
        def edit(h: Hypervisor) -> Hypervisor:
            return h.model_copy(update={"spec": h.spec.model_copy(update={"maintenance": value})})
        api.store.update_hypervisor("hv-cordon", edit, "operator")

    maintenance("drain")
    assert state() == (["COMPUTE_STATUS_DISABLED"], False, True)  # listed, as Placement lists a disabled node
    maintenance("")
    assert state() == ([], True, True)


def test_an_allocation_past_a_hypervisors_capacity_is_refused(api: Placement) -> None:
    uid = _uuid(api.store, "hv2")
    body = {"allocations": {uid: {"resources": {"VCPU": 17}}}, "project_id": "p", "user_id": "u",
            "consumer_generation": None, "consumer_type": "INSTANCE"}
    r = api.call("PUT", f"/allocations/{uuid.uuid4()}", "scheduler", body)
    assert r.status_code == 409 and "Unable to allocate inventory" in r.json()["errors"][0]["detail"]


def test_each_role_gets_what_the_policy_table_gives_it(api: Placement) -> None:
    hv1, hv2 = _uuid(api.store, "hv1"), _uuid(api.store, "hv2")
    consumer = str(uuid.uuid4())
    body = {"allocations": {hv1: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u",
            "consumer_generation": None, "consumer_type": "INSTANCE"}
    # A viewer reads what Placement's defaults let a reader read: a project's usages, nothing else.
    assert api.call("GET", "/usages?project_id=p", "viewer").status_code == 200
    for path in ("/resource_providers", f"/resource_providers/{hv1}/inventories", "/traits",
                 f"/allocations/{consumer}", "/allocation_candidates?resources=VCPU:1"):
        read = api.call("GET", path, "viewer")
        assert read.status_code == 403 and "placement:" in read.json()["errors"][0]["detail"], path
    refused = api.call("PUT", f"/allocations/{consumer}", "viewer", body)
    assert refused.status_code == 403 and refused.json()["errors"][0]["title"] == "Forbidden"
    assert api.call("PUT", f"/allocations/{consumer}", "operator", body).status_code == 403
    assert api.call("POST", "/resource_providers", "scheduler", {"name": "x"}).status_code == 403
    # An agent: its own tree's traits, nobody else's, and no fleet-wide list.
    gen = api.call("GET", f"/resource_providers/{hv1}", "agent").json()["generation"]
    put = api.call("PUT", f"/resource_providers/{hv1}/traits", "agent",
                   {"traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": gen})
    assert put.status_code == 200 and put.json()["traits"] == ["HW_CPU_X86_AVX2"]
    assert api.call("GET", f"/resource_providers/{hv2}", "agent").status_code == 403
    # Its own hypervisor's inventories (as nova-compute reports them: the rule above), no other's.
    mine = api.call("GET", f"/resource_providers/{hv1}/inventories", "agent")
    assert api.call("PUT", f"/resource_providers/{hv1}/inventories", "agent", mine.json()).status_code == 200
    theirs = api.call("GET", f"/resource_providers/{hv2}/inventories").json()
    assert api.call("PUT", f"/resource_providers/{hv2}/inventories", "agent", theirs).status_code == 403
    assert api.call("GET", "/usages?project_id=p", "agent").status_code == 403
    assert api.call("GET", "/resource_providers", "agent").status_code == 403
    assert api.call("GET", "/resource_providers", "agent").json()["errors"][0]["status"] == 403
    assert api.call("GET", "/", role="viewer").status_code == 200


# -- concurrency ------------------------------------------------------------------------


def test_eight_clients_never_overbook_a_stored_provider_on_sqlite(api: Placement) -> None:
    uid = _stored_provider(api, 20)
    won, usage = _race(api, uid, "DISK_GB", 20)
    assert won == usage == 20


def test_eight_clients_never_overbook_a_hypervisor_on_sqlite(api: Placement) -> None:
    put_host(api.store, host("hv-race", {"cpu": 10, "memory": "8Gi"}, beat=datetime.now(UTC)))
    uid = _uuid(api.store, "hv-race")
    won, usage = _race(api, uid, "VCPU", 10)
    assert won == usage == 10
    claims = [r for r in api.store.list_reservations() if r.spec.hypervisor == "hv-race"]
    assert len(claims) == 10


@pytest.fixture(scope="module")
def etcd_api(etcd_session: EtcdCluster) -> Iterator[Placement]:
    d = Path(tempfile.mkdtemp())
    store = open_store(f"etcd://{etcd_session.endpoints[0].split('://')[-1]}",
                       prefix=f"/p-{uuid.uuid4().hex[:12]}")
    _fleet(store)
    yield from _serve(store, d)
    store.close()


def test_eight_clients_never_overbook_on_etcd(etcd_api: Placement) -> None:
    uid = _stored_provider(etcd_api, 12)
    won, usage = _race(etcd_api, uid, "DISK_GB", 12, per_client=3)
    assert won == usage == 12
    hv = _uuid(etcd_api.store, "hv2")
    won, usage = _race(etcd_api, hv, "VCPU", 16, per_client=3)
    assert won == usage == 16



def test_a_read_right_after_a_write_of_placement_records_only_does_not_wait_on_etcd(
        etcd_api: Placement) -> None:
    """A write that touches no kind the fleet index follows (a claim on a
    stored provider: its record and its consumer; a custom resource class; a
    stored provider's traits) still moves etcd's revision, which the next
    read waits for the index to have seen. The shared feed hands such a
    revision to the index's watch as progress, so the read answers at once
    and with the write, not at the 0.5 s bound (FOLLOW_WAIT_S) each time."""
    uid = _stored_provider(etcd_api, 1000)
    query = "/allocation_candidates?resources=DISK_GB:1"
    assert etcd_api.call("GET", query).status_code == 200  # warm: the snapshot follows
    took: list[float] = []
    for i in range(5):
        writes = [
            ("PUT", f"/allocations/{uuid.uuid4()}", {
                "allocations": {uid: {"resources": {"DISK_GB": 1}}}, "project_id": "p", "user_id": "u",
                "consumer_generation": None, "consumer_type": "INSTANCE"}),
            ("PUT", f"/resource_classes/CUSTOM_NEXT_{i}_{uuid.uuid4().hex[:6].upper()}", None),
        ]
        for method, path, body in writes:
            assert etcd_api.call(method, path, body=body).status_code in (201, 204)
            began = time.monotonic()
            got = etcd_api.call("GET", query)
            took.append(time.monotonic() - began)
            assert got.status_code == 200, got.text
        assert got.json()["provider_summaries"][uid]["resources"]["DISK_GB"]["used"] == i + 1
    took.sort()
    assert took[len(took) // 2] < 0.2, took

def test_reshaper_moves_inventory_and_allocations_to_a_child_in_one_write(api: Placement) -> None:
    root = _stored_provider(api, 100)  # DISK_GB
    child = str(uuid.uuid4())
    assert api.call("POST", "/resource_providers", body={
        "name": child, "uuid": child, "parent_provider_uuid": root}).status_code == 200
    consumer, project, user = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    assert api.call("PUT", f"/allocations/{consumer}", body={
        "allocations": {root: {"resources": {"DISK_GB": 30}}}, "project_id": project, "user_id": user,
        "consumer_generation": None, "consumer_type": "INSTANCE"}).status_code == 204
    gens = {u: api.call("GET", f"/resource_providers/{u}").json()["generation"] for u in (root, child)}
    # Dropping the root's inventory while the allocation stays there is refused, whole.
    refused = api.call("POST", "/reshaper", body={
        "inventories": {root: {"resource_provider_generation": gens[root], "inventories": {}}},
        "allocations": {}})
    assert refused.status_code == 409 and "in use" in refused.json()["errors"][0]["detail"]
    assert api.call("GET", f"/resource_providers/{root}/inventories").json()["inventories"]
    moved = api.call("POST", "/reshaper", body={
        "inventories": {
            root: {"resource_provider_generation": gens[root], "inventories": {}},
            child: {"resource_provider_generation": gens[child],
                    "inventories": {"DISK_GB": {"total": 100}}}},
        "allocations": {consumer: {
            "allocations": {child: {"resources": {"DISK_GB": 30}}}, "project_id": project,
            "user_id": user, "consumer_generation": 1, "consumer_type": "INSTANCE"}}})
    assert moved.status_code == 204, moved.text
    assert api.call("GET", f"/resource_providers/{root}/inventories").json()["inventories"] == {}
    assert api.call("GET", f"/resource_providers/{child}/usages").json()["usages"] == {"DISK_GB": 30}
    assert api.call("GET", f"/allocations/{consumer}").json()["allocations"][child]["resources"] == {
        "DISK_GB": 30}
    assert api.call("POST", "/reshaper", "scheduler", {"inventories": {}, "allocations": {}}
                    ).status_code == 403


def _mixed_race(api: Placement, hv_name: str, disk: int) -> None:
    """8 clients allocate 1 VCPU on a hypervisor and 1 DISK_GB on a stored
    provider with room for `disk`, each in one PUT (most are refused: the disk
    is full, or its record changed under the write), while a reader checks
    that every claim it sees has its record's allocation (read after it, so an
    atomic write shows both): nothing half-done is ever visible, and in the
    end the claims are exactly the allocations that succeeded."""
    put_host(api.store, host(hv_name, {"cpu": 64, "memory": "8Gi"}, beat=datetime.now(UTC)))
    hv = _uuid(api.store, hv_name)
    sp = _stored_provider(api, disk)
    won: list[str] = []
    seen_half: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            claimed = {r.spec.consumer for r in api.store.list_reservations() if r.spec.hypervisor == hv_name}
            record = api.store.get("ResourceProvider", sp)
            allocated = set(record.spec.allocations)  # type: ignore[attr-defined]
            with lock:
                seen_half.extend(sorted(claimed - allocated))

    def client() -> None:
        for _ in range(2):
            consumer = str(uuid.uuid4())
            body = {"allocations": {hv: {"resources": {"VCPU": 1}}, sp: {"resources": {"DISK_GB": 1}}},
                    "project_id": "p", "user_id": "u", "consumer_generation": None,
                    "consumer_type": "INSTANCE"}
            _claim(api, consumer, body, won, lock)

    watcher = threading.Thread(target=reader)
    watcher.start()
    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert seen_half == []
    claims = {r.spec.consumer for r in api.store.list_reservations() if r.spec.hypervisor == hv_name}
    record = api.store.get("ResourceProvider", sp)
    assert claims == set(record.spec.allocations) == set(won)  # type: ignore[attr-defined]
    assert len(won) == disk


def test_a_mixed_allocation_is_one_atomic_write_under_concurrency_on_sqlite(api: Placement) -> None:
    _mixed_race(api, "hv-mix", 5)


def test_a_mixed_allocation_is_one_atomic_write_under_concurrency_on_etcd(etcd_api: Placement) -> None:
    _mixed_race(etcd_api, "hv-mix", 5)


def test_a_mixed_allocation_refused_by_its_claim_check_leaves_everything_as_it_was(api: Placement) -> None:
    """The claim check runs inside the write (a host that stopped being Ready
    still shows its inventories): its refusal refuses the record's write and
    keeps the consumer's old claim, which the change would have replaced."""
    put_host(api.store, host("hv-keep", {"cpu": 8, "memory": "8Gi"}, beat=datetime.now(UTC)))
    hv, sp = _uuid(api.store, "hv-keep"), _stored_provider(api, 4)
    consumer = str(uuid.uuid4())
    body = {"allocations": {hv: {"resources": {"VCPU": 2}}}, "project_id": "p", "user_id": "u",
            "consumer_generation": None, "consumer_type": "INSTANCE"}
    assert api.call("PUT", f"/allocations/{consumer}", body=body).status_code == 204

    def claims() -> list[tuple[str, Any]]:
        return [(r.name, r.spec.resources) for r in api.store.list_reservations()
                if r.spec.consumer == consumer]

    before, record = claims(), api.store.get("ResourceProvider", sp)
    assert len(before) == 1

    def not_ready(h: Hypervisor) -> Hypervisor:
        return h.model_copy(update={"status": h.status.model_copy(update={
            "conditions": [Condition(type="Ready", status="False")]})})

    api.store.update_hypervisor("hv-keep", not_ready, agent_manager("hv-keep"))
    body = {"allocations": {hv: {"resources": {"VCPU": 3}}, sp: {"resources": {"DISK_GB": 1}}},
            "project_id": "p", "user_id": "u", "consumer_generation": 1, "consumer_type": "INSTANCE"}
    r = api.call("PUT", f"/allocations/{consumer}", body=body)
    assert r.status_code == 409, r.text
    assert "Unable to allocate inventory" in r.text
    assert claims() == before
    assert api.store.get("ResourceProvider", sp) == record
    assert api.call("GET", f"/allocations/{consumer}").json()["allocations"] == {
        hv: {"resources": {"VCPU": 2}, "generation": 0}}


def test_nova_computes_registration_of_its_node_names_the_hypervisor_provider_to_use(api: Placement) -> None:
    """nova-compute POSTs {name: its hypervisor hostname, uuid: its compute
    node uuid}; the node already is the Hypervisor's provider, so the 409
    names that provider's uuid (docs/placement.md: give nova-compute that
    uuid as its compute node uuid, then its first GET finds the provider)."""
    hv1 = _uuid(api.store, "hv1")
    mine = str(uuid.uuid4())
    r = api.call("POST", "/resource_providers", body={"name": "hv1", "uuid": mine})
    assert r.status_code == 409
    error = r.json()["errors"][0]
    assert error["code"] == "placement.duplicate_name"
    assert f"Conflicting resource provider name: hv1 already exists. It is hvfleet's Hypervisor hv1, " \
           f"resource provider {hv1}" in error["detail"]
    assert api.call("GET", f"/resource_providers/{mine}").status_code == 404  # nothing made
    # The compute service's own token (an agent of hv1) creates no provider, and finds its node:
    assert api.call("POST", "/resource_providers", "agent", {"name": "hv1", "uuid": mine}).status_code == 403
    found = api.call("GET", f"/resource_providers/{hv1}", "agent")
    assert found.status_code == 200 and found.json()["name"] == "hv1"


def test_a_snapshot_loaded_from_the_store_keeps_a_hypervisor_with_traits_a_provider_with_inventories(
        api: Placement) -> None:
    """A trait (or aggregate) on a hypervisor's provider is a record of its
    own in the store; a snapshot loaded whole (a server's first request, or
    after its watch fell behind) joins it to the hypervisor's computed
    inventories, as the snapshot that followed the trait's write does."""
    put_host(api.store, host("hv-traits", {"cpu": 4, "memory": "4Gi"}, beat=datetime.now(UTC)))
    uid = _uuid(api.store, "hv-traits")
    gen = api.call("GET", f"/resource_providers/{uid}").json()["generation"]
    assert api.call("PUT", f"/resource_providers/{uid}/traits", body={
        "traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": gen}).status_code == 200
    followed = api.call("GET", "/allocation_candidates?resources=VCPU:4&required=HW_CPU_X86_AVX2").json()
    assert uid in followed["provider_summaries"]
    loaded = ProviderSnapshot.from_store(api.store).graph().providers[uid]
    assert loaded.traits == {"HW_CPU_X86_AVX2"}
    assert loaded.inventories["VCPU"].total == 4 and "MEMORY_MB" in loaded.inventories


def _served_candidates(api: Placement, path: str) -> tuple[int, Any]:
    """The answer to `path`, asked twice (the second is the body the server
    keeps for its graph), checked against an answer made from scratch: a
    new provider snapshot of the same store."""
    first = api.call("GET", path)
    again = api.call("GET", path)
    if first.status_code == 200:
        assert (again.status_code, again.text) == (200, first.text)
    else:  # the same refusal, under its own request id
        assert again.status_code == first.status_code
        assert again.json()["errors"][0]["detail"] == first.json()["errors"][0]["detail"]
    snap = ProviderSnapshot.from_store(api.store)
    classes, traits = snap.known_names()
    params: dict[str, list[str]] = {}
    for k, v in urllib.parse.parse_qsl(path.split("?", 1)[1]):
        params.setdefault(k, []).append(v)
    try:
        want: tuple[int, Any] = (200, json.loads(candidates.candidates_json(
            snap.graph(), params, (1, 39), resource_classes=classes, traits=traits)))
    except candidates.PlacementBadRequest as exc:
        want = (400, exc.detail)

    def unordered(doc: Any) -> Any:  # the two snapshots may list providers in another order
        return {**doc, "allocation_requests": sorted(json.dumps(a, sort_keys=True)
                                                     for a in doc["allocation_requests"])}

    if first.status_code == 400:
        assert want[0] == 400 and " ".join(want[1].split()) in " ".join(
            first.json()["errors"][0]["detail"].split())
        return 400, None
    assert first.status_code == 200 and want[0] == 200, first.text
    assert unordered(first.json()) == unordered(want[1])
    return 200, first.json()


@pytest.mark.parametrize("which", ["api", "etcd_api"])
def test_a_kept_candidates_answer_never_outlives_a_change(which: str, request: pytest.FixtureRequest) -> None:
    """The server keeps each candidates body with its provider graph. After
    every kind of change (an allocation, an inventory, a trait, an aggregate,
    a new custom trait, a ratio from an overcommit policy, a hypervisor's
    status) the same query answers from the new state, as a snapshot made
    from scratch answers it, never with the body kept from before."""
    api: Placement = request.getfixturevalue(which)
    rp = _stored_provider(api, 100)  # DISK_GB
    gen = 1
    r = api.call("PUT", f"/resource_providers/{rp}/inventories", body={
        "resource_provider_generation": gen, "inventories": {
            "DISK_GB": {"total": 100}, "VCPU": {"total": 8}, "MEMORY_MB": {"total": 4096}}})
    assert r.status_code == 200, r.text
    gen = r.json()["resource_provider_generation"]
    trait, agg = f"CUSTOM_P1K_{uuid.uuid4().hex[:8].upper()}", str(uuid.uuid4())
    plain = "/allocation_candidates?resources=VCPU:1,MEMORY_MB:512"
    with_trait = f"/allocation_candidates?resources=VCPU:1&required={trait}"
    in_agg = f"/allocation_candidates?resources=VCPU:1&member_of={agg}"

    def summary(doc: Any, uid: str) -> Any:
        return doc["provider_summaries"][uid]

    _, before = _served_candidates(api, plain)
    assert summary(before, rp)["resources"]["VCPU"] == {"capacity": 8, "used": 0}
    # An allocation.
    consumer = str(uuid.uuid4())
    assert api.call("PUT", f"/allocations/{consumer}", body={
        "allocations": {rp: {"resources": {"VCPU": 3}}}, "project_id": "p", "user_id": "u",
        "consumer_type": "INSTANCE",
        "consumer_generation": None}).status_code == 204
    _, now = _served_candidates(api, plain)
    assert summary(now, rp)["resources"]["VCPU"] == {"capacity": 8, "used": 3}
    gen += 1
    # An inventory (and its allocation ratio).
    r = api.call("PUT", f"/resource_providers/{rp}/inventories/VCPU", body={
        "resource_provider_generation": gen, "total": 8, "allocation_ratio": 2.0})
    assert r.status_code == 200, r.text
    gen = r.json()["resource_provider_generation"]
    _, now = _served_candidates(api, plain)
    assert summary(now, rp)["resources"]["VCPU"] == {"capacity": 16, "used": 3}
    # A custom trait created (a name the query may use), then put on the provider.
    assert _served_candidates(api, with_trait)[0] == 400
    assert api.call("PUT", f"/traits/{trait}").status_code == 201
    _, now = _served_candidates(api, with_trait)
    assert now["allocation_requests"] == []
    r = api.call("PUT", f"/resource_providers/{rp}/traits", body={
        "resource_provider_generation": gen, "traits": [trait]})
    assert r.status_code == 200, r.text
    gen = r.json()["resource_provider_generation"]
    _, now = _served_candidates(api, with_trait)
    assert [list(a["allocations"]) for a in now["allocation_requests"]] == [[rp]]
    # An aggregate.
    assert _served_candidates(api, in_agg)[1]["allocation_requests"] == []
    r = api.call("PUT", f"/resource_providers/{rp}/aggregates", body={
        "resource_provider_generation": gen, "aggregates": [agg]})
    assert r.status_code == 200, r.text
    _, now = _served_candidates(api, in_agg)
    assert [list(a["allocations"]) for a in now["allocation_requests"]] == [[rp]]
    # A ratio from an overcommit policy (hypervisors' inventories are computed).
    hv1 = _uuid(api.store, "hv1")
    _, before = _served_candidates(api, plain)
    policy = OvercommitPolicy(metadata=ObjectMeta(name=f"p1k-{uuid.uuid4().hex[:8]}"),
                              spec=OvercommitPolicySpec(overcommit={"memory": 1.5}, priority=-1000))
    api.store.create(policy, "test")
    try:
        _, now = _served_candidates(api, plain)
        memory = summary(before, hv1)["resources"]["MEMORY_MB"]["capacity"]
        assert summary(now, hv1)["resources"]["MEMORY_MB"]["capacity"] > memory
    finally:
        api.store.delete("OvercommitPolicy", policy.name)
    # A hypervisor's status (what its agent writes).
    _, before = _served_candidates(api, plain)
    h = api.store.get_hypervisor("hv1")
    was = summary(before, hv1)["resources"]["VCPU"]["capacity"]
    cpu = ResourceName.parse("cpu")
    capacity = {**h.status.capacity, cpu: Quantity(h.status.capacity[cpu].value + 4)}
    api.store.update(h.model_copy(update={"status": h.status.model_copy(update={"capacity": capacity})}),
                     agent_manager("hv1"))
    try:
        _, now = _served_candidates(api, plain)
        assert summary(now, hv1)["resources"]["VCPU"]["capacity"] == was + 4 * 2  # ratio 2.0
    finally:
        current = api.store.get_hypervisor("hv1")
        api.store.update(current.model_copy(update={"status": h.status}), agent_manager("hv1"))


def test_every_class_a_hypervisors_inventories_name_exists_in_placement_while_they_name_it(
        api: Placement) -> None:
    """In Placement no inventory is of a class that does not exist: a host's
    extra capacity (`CUSTOM_NIC_VF`) and hugepages (`CUSTOM_HUGEPAGES_2MI`)
    are listed and found as classes, asked for in candidates, allocated, and
    not deleted while in use (Placement's 409); they are no stored copy: a
    class no inventory names any more and nobody created is gone with it."""
    put_host(api.store, host("hv-vf", {"cpu": 4, "memory": "8Gi", "hugepages-2Mi": "1Gi"},
                             extra={"CUSTOM_NIC_VF": 4}, beat=datetime.now(UTC)))
    uid = _uuid(api.store, "hv-vf")
    inv = api.call("GET", f"/resource_providers/{uid}/inventories").json()["inventories"]
    assert {"CUSTOM_NIC_VF", "CUSTOM_HUGEPAGES_2MI"} <= set(inv)
    listed = [c["name"] for c in api.call("GET", "/resource_classes").json()["resource_classes"]]
    assert {"CUSTOM_NIC_VF", "CUSTOM_HUGEPAGES_2MI"} <= set(listed)
    # A one-off reader's whole read knows them as the server's snapshot does.
    assert {"CUSTOM_NIC_VF", "CUSTOM_HUGEPAGES_2MI"} <= Source(api.store).known_names()[0]
    for rc in ("CUSTOM_NIC_VF", "CUSTOM_HUGEPAGES_2MI"):
        assert api.call("GET", f"/resource_classes/{rc}").status_code == 200
        found = api.call("GET", f"/allocation_candidates?resources={rc}:1")
        assert found.status_code == 200, found.text
        assert uid in found.json()["provider_summaries"]
    consumer = str(uuid.uuid4())
    made = {"CUSTOM_NIC_VF": 2, "CUSTOM_HUGEPAGES_2MI": 3}
    put = api.call("PUT", f"/allocations/{consumer}", "scheduler", {
        "allocations": {uid: {"resources": made}}, "project_id": str(uuid.uuid4()),
        "user_id": str(uuid.uuid4()), "consumer_generation": None, "consumer_type": "INSTANCE"})
    assert put.status_code == 204, put.text
    usages = api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]
    assert usages["CUSTOM_NIC_VF"] == 2 and usages["CUSTOM_HUGEPAGES_2MI"] == 3
    refused = api.call("DELETE", "/resource_classes/CUSTOM_NIC_VF")
    assert refused.status_code == 409
    assert refused.json()["errors"][0]["detail"].strip().endswith(
        "Error in delete resource class: Cannot delete resource class CUSTOM_NIC_VF. "
        "Class is in use in inventory.")
    # It exists: a POST of it is Placement's conflict, a PUT (1.7) finds it.
    assert api.call("POST", "/resource_classes", body={"name": "CUSTOM_NIC_VF"}).status_code == 409
    assert api.call("PUT", "/resource_classes/CUSTOM_NIC_VF").status_code == 204
    assert api.call("DELETE", f"/allocations/{consumer}", "scheduler").status_code == 204
    api.store.delete("Hypervisor", "hv-vf")
    listed = [c["name"] for c in api.call("GET", "/resource_classes").json()["resource_classes"]]
    # The PUT made CUSTOM_NIC_VF a class of its own; the hugepages class went with the host.
    assert "CUSTOM_NIC_VF" in listed and "CUSTOM_HUGEPAGES_2MI" not in listed
    assert api.call("GET", "/resource_classes/CUSTOM_HUGEPAGES_2MI").status_code == 404
    assert api.call("DELETE", "/resource_classes/CUSTOM_NIC_VF").status_code == 204


def test_a_hosts_pool_of_any_hugepage_size_is_a_placement_class_counted_in_pages(api: Placement) -> None:
    """An arm64 host's 32 MiB pages are `CUSTOM_HUGEPAGES_32MI` (as its 2 MiB
    ones are `CUSTOM_HUGEPAGES_2MI`), one unit a page: listed as a class,
    found in candidates, and an allocation of it is a claim of
    `hugepages-32Mi` in bytes."""
    put_host(api.store, host("hv-arm", {"cpu": 4, "memory": "8Gi", "hugepages-32Mi": "1Gi",
                                        "hugepages-64Ki": "256Mi"}, beat=datetime.now(UTC)))
    uid = _uuid(api.store, "hv-arm")
    try:
        inv = api.call("GET", f"/resource_providers/{uid}/inventories").json()["inventories"]
        assert (inv["CUSTOM_HUGEPAGES_32MI"]["total"], inv["CUSTOM_HUGEPAGES_64KI"]["total"]) == (32, 4096)
        listed = [c["name"] for c in api.call("GET", "/resource_classes").json()["resource_classes"]]
        assert {"CUSTOM_HUGEPAGES_32MI", "CUSTOM_HUGEPAGES_64KI"} <= set(listed)
        found = api.call("GET", "/allocation_candidates?resources=CUSTOM_HUGEPAGES_32MI:32")
        assert found.status_code == 200, found.text
        assert list(found.json()["provider_summaries"]) == [uid]
        too_many = api.call("GET", "/allocation_candidates?resources=CUSTOM_HUGEPAGES_32MI:33")
        assert too_many.json()["allocation_requests"] == []
        consumer = str(uuid.uuid4())
        put = api.call("PUT", f"/allocations/{consumer}", "scheduler", {
            "allocations": {uid: {"resources": {"CUSTOM_HUGEPAGES_32MI": 3}}},
            "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()), "consumer_generation": None,
            "consumer_type": "INSTANCE"})
        assert put.status_code == 204, put.text
        usages = api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]
        assert usages["CUSTOM_HUGEPAGES_32MI"] == 3
        [claim] = [r for r in api.store.list_reservations() if r.spec.consumer == consumer]
        assert {str(k): str(v) for k, v in claim.spec.resources.items()} == {"hugepages-32Mi": "96Mi"}
        assert api.call("DELETE", f"/allocations/{consumer}", "scheduler").status_code == 204
    finally:
        api.store.delete("Hypervisor", "hv-arm")
