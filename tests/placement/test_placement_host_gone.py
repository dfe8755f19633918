"""A Hypervisor deleted in hvfleet while providers a client created hang
under it in Placement (nova-compute's pGPU providers under its node, each
with VGPU inventory, as Nova's libvirt driver makes them): the Placement
API keeps answering for the rest of the fleet, the gone host's tree leaves
every answer with its root (Placement never has a provider whose root is
gone), and the collector deletes the tree's records, on SQLite and etcd."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.model.errors import NotFound
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.placement import ResourceProvider, ResourceProviderSpec
from hvfleet.placement.records import cut_off, read_fleet
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.store import open_store
from hvfleet.store.lifecycle import delete
from tests.placement.support import Placement, _fleet, _serve, _uuid
from tests.support.etcd_local import EtcdCluster


@pytest.fixture(params=["sqlite", "etcd"])
def api(request: pytest.FixtureRequest) -> Iterator[Placement]:
    d = Path(tempfile.mkdtemp())
    if request.param == "sqlite":
        store = open_store(f"sqlite:///{d}/hvfleet.db")
    else:
        etcd: EtcdCluster = request.getfixturevalue("etcd_session")
        store = open_store(f"etcd://{etcd.endpoints[0].split('://')[-1]}",
                           prefix=f"/gone-{uuid.uuid4().hex[:12]}")
    _fleet(store)
    yield from _serve(store, d)
    store.close()


def _ok(r: requests.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def _gpu_tree(api: Placement, root: str) -> tuple[str, str]:
    """A pGPU provider under `root` with 4 VGPU, and a child of it (a
    grandchild of the host) with 2 more: created as nova-compute creates them."""
    gpu, sub = str(uuid.uuid4()), str(uuid.uuid4())
    for uid, parent, total in ((gpu, root, 4), (sub, gpu, 2)):
        _ok(api.call("POST", "/resource_providers", body={
            "name": f"pgpu-{uid[:8]}", "uuid": uid, "parent_provider_uuid": parent}))
        _ok(api.call("PUT", f"/resource_providers/{uid}/inventories", body={
            "resource_provider_generation": 0, "inventories": {"VGPU": {"total": total}}}))
    return gpu, sub


def _claim(api: Placement, consumer: str, allocations: dict[str, dict[str, int]]) -> None:
    _ok(api.call("PUT", f"/allocations/{consumer}", "scheduler", body={
        "allocations": {u: {"resources": r} for u, r in allocations.items()},
        "project_id": "proj", "user_id": "user", "consumer_generation": None,
        "consumer_type": "INSTANCE"}), 204)


def test_a_deleted_hypervisor_takes_its_tree_out_of_every_placement_answer(api: Placement) -> None:
    hv1, hv2 = _uuid(api.store, "hv1"), _uuid(api.store, "hv2")
    gpu, sub = _gpu_tree(api, hv1)
    on_gone, on_kept = str(uuid.uuid4()), str(uuid.uuid4())
    _claim(api, on_gone, {hv1: {"VCPU": 1}, gpu: {"VGPU": 1}})
    _claim(api, on_kept, {hv2: {"VCPU": 2}})
    tree = _ok(api.call("GET", f"/resource_providers?in_tree={sub}"))["resource_providers"]
    assert {p["uuid"] for p in tree} == {hv1, gpu, sub}
    assert _ok(api.call("GET", "/allocation_candidates?resources=VCPU:1,VGPU:1"))["allocation_requests"]

    delete(api.store, api.store.get_hypervisor("hv1"), "test")  # as `hvfleet delete hypervisor hv1`

    listed = _ok(api.call("GET", "/resource_providers"))["resource_providers"]
    assert [p["uuid"] for p in listed] == [hv2]
    for uid in (hv1, gpu, sub):
        _ok(api.call("GET", f"/resource_providers/{uid}"), 404)
        assert _ok(api.call("GET", f"/resource_providers?in_tree={uid}"))["resource_providers"] == []
    assert _ok(api.call("GET", "/allocation_candidates?resources=VGPU:1")) == {
        "allocation_requests": [], "provider_summaries": {}}
    got = _ok(api.call("GET", "/allocation_candidates?resources=VCPU:1"))
    assert set(got["provider_summaries"]) == {hv2}
    # The consumer on the gone host keeps no allocation there; the other is untouched.
    gone = _ok(api.call("GET", f"/allocations/{on_gone}"))
    assert gone["allocations"] == {}
    kept = _ok(api.call("GET", f"/allocations/{on_kept}"))["allocations"]
    assert {u: a["resources"] for u, a in kept.items()} == {hv2: {"VCPU": 2}}
    assert _ok(api.call("GET", "/usages?project_id=proj"))["usages"] == {
        "INSTANCE": {"VCPU": 2, "consumer_count": 1}}
    # It is no consumer, as in Placement: it is given a new home as a new
    # one (Nova's evacuation), and a DELETE of a consumer without
    # allocations is Placement's 404, its record gone with it.
    _ok(api.call("PUT", f"/allocations/{on_gone}", "scheduler", body={
        "allocations": {hv2: {"resources": {"VCPU": 1}}}, "project_id": "proj", "user_id": "user",
        "consumer_generation": None, "consumer_type": "INSTANCE"}), 204)
    moved = _ok(api.call("GET", f"/allocations/{on_gone}"))
    assert {u: a["resources"] for u, a in moved["allocations"].items()} == {hv2: {"VCPU": 1}}
    assert moved["consumer_generation"] == 2  # moves on from the record's 1
    _ok(api.call("DELETE", f"/allocations/{on_gone}"), 204)
    # One truth: a snapshot loaded afresh and a whole read agree.
    whole = read_fleet(api.store)
    assert set(whole.providers) == {hv2}
    loaded = ProviderSnapshot.from_store(api.store)
    assert dict(loaded.fleet().providers) == dict(whole.providers)
    assert loaded.graph().providers == whole.graph().providers

    unheld = str(uuid.uuid4())
    other_gpu, _ = _gpu_tree(api, hv2)
    _claim(api, unheld, {other_gpu: {"VGPU": 1}})
    delete(api.store, api.store.get_hypervisor("hv2"), "test")
    assert _ok(api.call("GET", f"/allocations/{unheld}")) == {"allocations": {}}
    _ok(api.call("DELETE", f"/allocations/{unheld}"), 404)
    with pytest.raises(NotFound):
        api.store.get("PlacementConsumer", unheld)
    assert _ok(api.call("GET", "/resource_providers"))["resource_providers"] == []


def test_the_collector_deletes_the_placement_records_of_a_deleted_hypervisors_tree(
        api: Placement) -> None:
    hv1, hv2 = _uuid(api.store, "hv1"), _uuid(api.store, "hv2")
    gpu, sub = _gpu_tree(api, hv1)
    other, other_sub = _gpu_tree(api, hv2)
    for root in (hv1, hv2):  # each host's own record (its traits)
        gen = _ok(api.call("GET", f"/resource_providers/{root}"))["generation"]
        _ok(api.call("PUT", f"/resource_providers/{root}/traits", body={
            "resource_provider_generation": gen, "traits": ["HW_CPU_X86_AVX2"]}))
    _claim(api, str(uuid.uuid4()), {hv1: {"VCPU": 1}, gpu: {"VGPU": 1}})

    delete(api.store, api.store.get_hypervisor("hv1"), "test")

    def stored(uid: str) -> bool:
        try:
            api.store.get("ResourceProvider", uid)
            return True
        except NotFound:
            return False

    deadline = time.monotonic() + 10
    while any(stored(u) for u in (hv1, gpu, sub)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [u for u in (hv1, gpu, sub) if stored(u)] == []
    # The other host's tree is untouched.
    assert stored(hv2) and stored(other) and stored(other_sub)
    assert {p["uuid"] for p in _ok(api.call("GET", f"/resource_providers?in_tree={hv2}"))[
        "resource_providers"]} == {hv2, other, other_sub}


@st.composite
def _forests(draw: st.DrawFn) -> tuple[dict[str, ResourceProvider], set[str]]:
    """Stored records over hypervisor roots, some of whose roots and records
    are gone (and, as no write makes, a loop or two), and the hosts left."""
    hosts = [f"h{i}" for i in range(draw(st.integers(0, 3)))]
    names = [f"r{i}" for i in range(draw(st.integers(0, 12)))]
    records: dict[str, ResourceProvider] = {}
    for i, name in enumerate(names):
        parent = draw(st.one_of(st.none(), st.sampled_from(hosts + names[: i + 1] + ["gone"])))
        records[name] = ResourceProvider(metadata=ObjectMeta(name=name),
                                         spec=ResourceProviderSpec(parent_uuid=parent))
    for h in draw(st.lists(st.sampled_from(hosts), unique=True)) if hosts else []:
        # a host's own record of traits: in the records, never a stored provider
        records[h] = ResourceProvider(metadata=ObjectMeta(name=h), spec=ResourceProviderSpec(hypervisor=h))
    for r in draw(st.lists(st.sampled_from(names), unique=True)) if names else []:
        if draw(st.booleans()):
            del records[r]
    left = set(draw(st.lists(st.sampled_from(hosts), unique=True))) if hosts else set()
    return records, left


@settings(max_examples=300, deadline=None)
@given(_forests())
def test_cut_off_is_what_a_walk_down_from_the_roots_never_reaches(
        forest: tuple[dict[str, ResourceProvider], set[str]]) -> None:
    records, roots = forest
    stored = {u for u, r in records.items() if r.spec.hypervisor is None}
    reached = {u for u in stored if records[u].spec.parent_uuid is None} | roots
    grown = True
    while grown:  # down from every root, a level at a time
        below = {u for u in stored if records[u].spec.parent_uuid in reached} - reached
        reached |= below
        grown = bool(below)
    assert cut_off(records, roots) == stored - reached
