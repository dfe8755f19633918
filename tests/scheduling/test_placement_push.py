"""`placement sync` pushing hvfleet's inventories and claims to a real Placement
over HTTP, and the pure planning behind it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from real_placement import RealPlacement
from sched_fleet import host, now, put_host, reservation

from hvfleet.model import Quantity, ResourceName
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Instance
from hvfleet.scheduling.placement import export_inventories, provider_uuid, sync
from hvfleet.scheduling.placement_client import (
    IDEMPOTENT_RESOURCE_CLASSES,
    PlacementClient,
    microversion_tuple,
)
from hvfleet.scheduling.placement_push import (
    ConsumerState,
    ProviderTree,
    PushIdentity,
    claim_allocations,
    custom_classes,
    plan_claims,
    planned_inventories,
)
from hvfleet.store import Store, open_store
from hvfleet.store.ownership import agent_manager

ME = PushIdentity()
C1 = "00000000-0000-4000-8000-0000000000a1"
C2 = "00000000-0000-4000-8000-0000000000a2"
NOVA_VM = "00000000-0000-4000-8000-0000000000b1"


@pytest.fixture(scope="module")
def placement() -> Iterator[RealPlacement]:
    with RealPlacement() as p:
        yield p


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path}/hvfleet.db"
    monkeypatch.setenv("HVFLEET_STORE", url)
    s = open_store(url)
    put_host(
        s, host("hv-a", {"cpu": 8, "memory": "32Gi"}, extra={"VGPU": 4}, beat=now(), labels={"zone": "x"})
    )
    put_host(s, host("hv-b", {"cpu": 8, "memory": "32Gi"}, beat=now(), labels={"zone": "y"}))
    yield s
    s.close()


def _providers(c: PlacementClient, store: Store, *names: str) -> dict[str, str]:
    """Create an empty root provider per hypervisor, as nova-compute would."""
    out = {}
    for name in names:
        rp = provider_uuid(store.get_hypervisor(name))
        c.request("POST", "/resource_providers", {"name": name, "uuid": rp})
        out[name] = rp
    return out


def _gpu_under(c: PlacementClient, root: str, name: str) -> str:
    gpu = str(uuid.uuid4())
    c.request("POST", "/resource_providers", {"name": name, "uuid": gpu, "parent_provider_uuid": root})
    c.request(
        "PUT",
        f"/resource_providers/{gpu}/inventories",
        {"resource_provider_generation": 0, "inventories": {"VGPU": {"total": 4}}},
    )
    return gpu


def _candidates(c: PlacementClient, query: str) -> set[str]:
    return set(c.get(f"/allocation_candidates?resources={query}")["provider_summaries"])


def _sync(run: Any, url: str, *more: str) -> dict[str, Any]:
    r = run("placement", "sync", "--url", url, "-o", "json", *more)
    assert r.code == 0, r.err
    return json.loads(r.out)  # type: ignore[no-any-return]


def _fresh(placement: RealPlacement) -> PlacementClient:
    """The module's Placement with every provider of earlier tests removed."""
    c = placement.client()
    for rp in c.get("/resource_providers")["resource_providers"]:
        for consumer in c.get(f"/resource_providers/{rp['uuid']}/allocations")["allocations"]:
            c.delete_allocations(consumer)
    for rp in sorted(
        c.get("/resource_providers")["resource_providers"], key=lambda p: p["parent_provider_uuid"] is None
    ):
        c.request("DELETE", f"/resource_providers/{rp['uuid']}")
    return c


def test_overcommit_set_then_sync_changes_placement_ratio_and_candidates(
    store: Store, run: Any, placement: RealPlacement
) -> None:
    c = _fresh(placement)
    rp = _providers(c, store, "hv-a", "hv-b")
    gpu = _gpu_under(c, rp["hv-a"], "hv-a-pgpu0")
    # A class hvfleet does not compute stays as Placement has it.
    gen, _ = c.inventories(rp["hv-b"])
    c.put_inventories(rp["hv-b"], gen, {"DISK_GB": {"total": 100}})
    assert rp["hv-a"] not in _candidates(c, "VCPU:1")

    report = _sync(run, placement.url)
    assert report["inventories"] == {
        "updated": ["hv-a", "hv-b"],
        "unchanged": 0,
        "retries": 0,
        "missingProviders": [],
    }
    _, inv_a = c.inventories(rp["hv-a"])
    _, inv_b = c.inventories(rp["hv-b"])
    exported = export_inventories(store.get_hypervisor("hv-a"))
    # The same numbers `placement export` shows, except VGPU: a nested provider
    # (nova's pGPU) already has it, and pushing it to the root would count it twice.
    assert set(exported) == {"VCPU", "MEMORY_MB", "VGPU"}
    assert {k: {f: inv_a[k][f] for f in v} for k, v in exported.items() if k != "VGPU"} == {
        k: v for k, v in exported.items() if k != "VGPU"
    }
    assert "VGPU" not in inv_a and c.inventories(gpu)[1]["VGPU"]["total"] == 4
    assert inv_b["DISK_GB"]["total"] == 100 and inv_b["VCPU"]["total"] == 8
    assert rp["hv-a"] in _candidates(c, "VCPU:8") and rp["hv-a"] not in _candidates(c, "VCPU:16")

    r = run("overcommit", "set", "hv-a", "cpu=4")
    assert r.code == 0, r.err
    report = _sync(run, placement.url)
    assert (report["inventories"]["updated"], report["inventories"]["unchanged"]) == (["hv-a"], 1)
    _, inv_a = c.inventories(rp["hv-a"])
    assert inv_a["VCPU"]["allocation_ratio"] == 4.0
    assert inv_a["VCPU"]["max_unit"] == 8  # more guests, not bigger ones
    assert rp["hv-a"] in _candidates(c, "VCPU:8")
    assert rp["hv-a"] not in _candidates(c, "VCPU:16")  # a single request stays ≤ max_unit
    # Four 8-vCPU guests now fit where one did: Placement accepts 32 vCPU of allocations.
    for _ in range(4):
        body = {"allocations": {rp["hv-a"]: {"resources": {"VCPU": 8}}}, "project_id": "nova", "user_id": "u"}
        c.request("PUT", f"/allocations/{uuid.uuid4()}", {**body, "consumer_generation": None})
    assert rp["hv-a"] not in _candidates(c, "VCPU:1")

    second = _sync(run, placement.url)
    assert second["inventories"] == {"updated": [], "unchanged": 2, "retries": 0, "missingProviders": []}


class RacingClient(PlacementClient):
    """A real client that, just before each of its first `races` inventory writes,
    lets another real client bump the provider's generation (a trait update, as
    nova-compute does), so the write names a generation that just went stale."""

    def __init__(self, url: str, races: int) -> None:
        super().__init__(url)
        self.races = races
        self.other = PlacementClient(url)

    def put_inventories(self, rp_uuid: str, generation: int, inventories: dict[str, dict[str, Any]]) -> int:
        if self.races > 0:
            self.races -= 1
            traits = self.other.get(f"/resource_providers/{rp_uuid}/traits")
            name = f"CUSTOM_RACE_{self.races}"
            self.other.request("PUT", f"/traits/{name}", expect=(201, 204))
            self.other.request(
                "PUT",
                f"/resource_providers/{rp_uuid}/traits",
                {
                    "traits": [*traits["traits"], name],
                    "resource_provider_generation": traits["resource_provider_generation"],
                },
            )
        return super().put_inventories(rp_uuid, generation, inventories)


def test_a_concurrent_generation_bump_is_reread_and_retried(store: Store, placement: RealPlacement) -> None:
    c = _fresh(placement)
    rp = _providers(c, store, "hv-a")
    with RacingClient(placement.url, races=2) as racing:
        report = sync(store, racing)
    assert report.errors == []
    assert report.inventories == {
        "updated": ["hv-a"],
        "unchanged": 0,
        "retries": 2,
        "missingProviders": ["hv-b"],
    }
    _, inv = c.inventories(rp["hv-a"])
    assert inv["VCPU"]["total"] == 8
    # The other writer's change survived: nothing was overwritten blindly.
    assert set(c.get(f"/resource_providers/{rp['hv-a']}/traits")["traits"]) == {
        "CUSTOM_RACE_0",
        "CUSTOM_RACE_1",
    }


def test_a_generation_that_changes_on_every_attempt_gives_up_bounded(
    store: Store, placement: RealPlacement
) -> None:
    c = _fresh(placement)
    rp = _providers(c, store, "hv-a")
    with RacingClient(placement.url, races=100) as racing:
        report = sync(store, racing)
        assert racing.races == 95
    assert report.errors == ["provider hv-a: generation changed on each of 5 attempts"]
    assert report.inventories is not None and report.inventories["retries"] == 5
    assert c.inventories(rp["hv-a"])[1] == {}


def test_push_claims_creates_and_removes_allocations_and_never_mirrors_them(
    store: Store, run: Any, placement: RealPlacement
) -> None:
    c = _fresh(placement)
    rp = _providers(c, store, "hv-a", "hv-b")
    gpu = _gpu_under(c, rp["hv-a"], "hv-a-pgpu0")
    r = run("reserve", "hv-a", "--cpu", "2", "--memory", "1Gi", "--resource", "VGPU=1", "--consumer", C1)
    assert r.code == 0, r.err
    claim1 = r.out.strip()
    assert run("reserve", "hv-b", "--cpu", "1", "--consumer", C2).code == 0
    # nova already allocated this consumer on hv-b under its own project: hvfleet
    # must neither overwrite it nor mirror it while its own claim holds the space.
    assert run("reserve", "hv-b", "--cpu", "1", "--consumer", NOVA_VM).code == 0
    body = {"allocations": {}, "project_id": "nova", "user_id": "nova", "consumer_generation": None}
    _sync(run, placement.url)  # inventories first, so nova's allocation fits
    body["allocations"] = {rp["hv-b"]: {"resources": {"VCPU": 1}}}
    c.put_allocations(NOVA_VM, body)

    report = _sync(run, placement.url, "--push-claims")
    assert report["claims"] == {
        "created": [C1, C2],
        "updated": [],
        "deleted": [],
        "unchanged": 0,
        "retries": 0,
        "foreign": [NOVA_VM],
    }
    got = c.consumer_allocations(C1)
    assert (got["project_id"], got["user_id"]) == (ME.project_id, ME.user_id)
    assert {k: v["resources"] for k, v in got["allocations"].items()} == {
        rp["hv-a"]: {"VCPU": 2, "MEMORY_MB": 1024},
        gpu: {"VGPU": 1},  # on the pGPU that has the VGPU inventory
    }
    assert c.consumer_allocations(NOVA_VM)["project_id"] == "nova"
    assert report["created"] == []  # nothing mirrored back as a placement reservation
    assert {r.spec.source for r in store.list_reservations()} == {"hvfleet"}

    again = _sync(run, placement.url, "--push-claims")
    assert (again["claims"]["unchanged"], again["claims"]["created"], again["claims"]["foreign"]) == (
        2,
        [],
        [NOVA_VM],
    )
    assert (again["created"], again["updated"], again["deleted"]) == ([], [], [])
    assert again["inventories"]["updated"] == []

    # A released claim's allocation goes; so does one whose reservation was deleted.
    assert run("release", claim1).code == 0
    res2 = next(r for r in store.list_reservations() if r.spec.consumer == C2)
    store.delete("Reservation", res2.name)
    report = _sync(run, placement.url, "--push-claims")
    assert report["claims"]["deleted"] == [C1, C2]
    assert c.consumer_allocations(C1)["allocations"] == {}
    assert c.consumer_allocations(C2)["allocations"] == {}
    assert c.consumer_allocations(NOVA_VM)["allocations"] != {}
    # hvfleet's own claim for nova's consumer still holds: still not mirrored.
    assert report["created"] == []
    assert _sync(run, placement.url, "--push-claims")["claims"]["deleted"] == []


def test_a_claim_placement_cannot_express_fails_the_sync(
    store: Store, run: Any, placement: RealPlacement
) -> None:
    c = _fresh(placement)
    _providers(c, store, "hv-a")
    # `hvfleet reserve` now refuses such a consumer (exit 2); one written
    # before that rule, or through another client, is still in the store.
    assert run("reserve", "hv-a", "--cpu", "1", "--consumer", "vm-not-a-uuid").code == 2
    store.create(reservation("old-claim", "hv-a", {"cpu": 1}, consumer="vm-not-a-uuid"), "operator")
    r = run("placement", "sync", "--url", placement.url, "--push-claims")
    assert r.code == 1
    assert "consumer 'vm-not-a-uuid' is not a UUID" in r.err


# -- custom resource classes (issue 22) -----------------------------------------------------

NIC_VF, HUGEPAGES = "CUSTOM_NIC_VF", "CUSTOM_HUGEPAGES_2MI"


def _without_custom_classes(c: PlacementClient) -> None:
    """Earlier tests' custom classes removed, so each test sees them created."""
    for rc in c.get("/resource_classes")["resource_classes"]:
        if rc["name"].startswith("CUSTOM_"):
            c.request("DELETE", f"/resource_classes/{rc['name']}")


def _custom_classes(c: PlacementClient) -> set[str]:
    names = {rc["name"] for rc in c.get("/resource_classes")["resource_classes"]}
    return {n for n in names if n.startswith("CUSTOM_")}


def _gpu_host(store: Store) -> None:
    """gpu-01 as the example fleet declares it, plus a hugepage pool the agent
    discovers: three classes Placement does not know until they are created."""
    put_host(
        store,
        host(
            "gpu-01",
            {"cpu": 32, "memory": "128Gi", "hugepages-2Mi": "2Gi"},
            extra={"VGPU": 8, NIC_VF: 32},
            beat=now(),
        ),
    )


def _exported(run: Any) -> dict[str, dict[str, Any]]:
    r = run("placement", "export")
    assert r.code == 0, r.err
    return {p["uuid"]: p["inventories"] for p in json.loads(r.out)["resource_providers"]}


def test_a_fleet_with_custom_classes_syncs_and_its_claims_become_allocations(
    store: Store, run: Any, placement: RealPlacement
) -> None:
    c = _fresh(placement)
    _without_custom_classes(c)
    _gpu_host(store)
    rp = _providers(c, store, "hv-a", "hv-b", "gpu-01")
    assert run("reserve", "gpu-01", "--cpu", "2", "--resource", f"{NIC_VF}=4", "--consumer", C1).code == 0

    first = run("placement", "sync", "--url", placement.url, "--push-claims")
    assert first.code == 0, first.err
    assert "resource classes: created 2, existing 0" in first.out

    assert _custom_classes(c) == {NIC_VF, HUGEPAGES}
    # Every provider holds exactly what `placement export` computes.
    exported = _exported(run)
    assert set(exported) == set(rp.values())
    for uuid_, inventories in exported.items():
        held = c.inventories(uuid_)[1]
        assert {cls: {f: held[cls][f] for f in inv} for cls, inv in held.items() if cls in inventories} == (
            inventories
        )
        assert set(held) == set(inventories)
    assert exported[rp["gpu-01"]][NIC_VF]["total"] == 32
    assert exported[rp["gpu-01"]][HUGEPAGES]["total"] == 1024
    got = c.consumer_allocations(C1)
    assert {k: v["resources"] for k, v in got["allocations"].items()} == {
        rp["gpu-01"]: {"VCPU": 2, NIC_VF: 4}
    }
    assert rp["gpu-01"] not in _candidates(c, f"{NIC_VF}:29")
    assert rp["gpu-01"] in _candidates(c, f"{NIC_VF}:28")

    again = _sync(run, placement.url, "--push-claims")
    assert again["resourceClasses"] == {"created": [], "existing": 2}
    assert again["inventories"] == {"updated": [], "unchanged": 3, "retries": 0, "missingProviders": []}
    claims = again["claims"]
    assert (claims["created"], claims["updated"], claims["unchanged"]) == ([], [], 1)
    assert (again["created"], again["updated"], again["deleted"]) == ([], [], [])
    assert again["errors"] == []


def test_before_microversion_1_7_a_custom_class_is_posted_and_409_means_it_exists(
    store: Store, placement: RealPlacement
) -> None:
    c = _fresh(placement)
    _without_custom_classes(c)
    _gpu_host(store)
    rp = _providers(c, store, "gpu-01")
    c.request("PUT", f"/resource_classes/{NIC_VF}")  # someone (nova) made this one already
    with placement.client("1.6") as old:
        report = sync(store, old)
    assert report.errors == []
    assert report.resource_classes == {"created": [HUGEPAGES], "existing": 1}
    assert report.inventories is not None and report.inventories["updated"] == ["gpu-01"]
    held = c.inventories(rp["gpu-01"])[1]
    assert (held[NIC_VF]["total"], held[HUGEPAGES]["total"]) == (32, 1024)
    with placement.client("1.6") as old:
        assert sync(store, old).resource_classes == {"created": [], "existing": 2}


def test_a_claim_of_a_custom_class_ensures_it_without_pushing_inventories(
    store: Store, run: Any, placement: RealPlacement
) -> None:
    """Inventories managed by someone else (nova): the claim push alone still
    ensures the class its claim carries."""
    c = _fresh(placement)
    _without_custom_classes(c)
    _gpu_host(store)
    rp = _providers(c, store, "gpu-01")
    assert run("reserve", "gpu-01", "--resource", f"{NIC_VF}=4", "--consumer", C1).code == 0
    claims_only = ("--no-push-inventories", "--push-claims")
    r = run("placement", "sync", "--url", placement.url, "-o", "json", *claims_only)
    assert r.code == 1  # no provider has the class's inventory yet
    report = json.loads(r.out)
    assert report["resourceClasses"] == {"created": [NIC_VF], "existing": 0}
    assert "inventories" not in report
    # The class exists now, so nova can give the provider its inventory; the
    # next claim push then allocates it.
    claim = next(r.name for r in store.list_reservations() if r.spec.consumer == C1)
    assert report["errors"] == [
        f"reservation {claim}: resources.{NIC_VF}: no provider of gpu-01 in Placement has {NIC_VF}"
    ]
    gen, _ = c.inventories(rp["gpu-01"])
    c.put_inventories(rp["gpu-01"], gen, {NIC_VF: {"total": 32}})
    second = _sync(run, placement.url, *claims_only)
    assert second["claims"]["created"] == [C1]
    assert c.consumer_allocations(C1)["allocations"][rp["gpu-01"]]["resources"] == {NIC_VF: 4}


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_example_fleet_syncs_as_nova_has_it_gpu_01_included(
    run: Any, placement: RealPlacement, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 as reported: the example fleet (agents on its test-driver hosts,
    then `apply -f examples/fleet-spec.yaml`), one provider per hypervisor
    created by name as nova-compute does, `sync --push-claims`."""
    url = f"sqlite:///{tmp_path}/example.db"
    monkeypatch.setenv("HVFLEET_STORE", url)
    for node in sorted((EXAMPLES / "fleet").glob("*.xml")):
        subprocess.run([sys.executable, "-m", "hvfleet", "agent", "--connect", f"test://{node}",
                        "--store", url, "--once"], check=True, capture_output=True, timeout=120)
    assert run("apply", "-f", str(EXAMPLES / "fleet-spec.yaml")).code == 0
    c = _fresh(placement)
    _without_custom_classes(c)
    with open_store(url) as fleet:
        names = sorted(h.name for h in fleet.list_hypervisors())
    assert "gpu-01" in names and len(names) == 7
    rp = {}
    for name in names:
        c.request("POST", "/resource_providers", {"name": name})
        rp[name] = next(p["uuid"] for p in c.get("/resource_providers")["resource_providers"]
                        if p["name"] == name)
    r = run("reserve", "gpu-01", "--cpu", "2", "--memory", "4Gi", "--resource", "VGPU=1",
            "--resource", f"{NIC_VF}=2", "--consumer", C1)
    assert r.code == 0, r.err

    first = _sync(run, placement.url, "--push-claims")
    assert first["errors"] == []
    assert first["resourceClasses"] == {"created": [NIC_VF], "existing": 0}
    assert sorted(first["inventories"]["updated"]) == names
    exported = {p["name"]: p["inventories"] for p in json.loads(run("placement", "export").out)[
        "resource_providers"]}
    for name in names:
        held = c.inventories(rp[name])[1]
        assert {cls: {f: held[cls][f] for f in inv} for cls, inv in held.items()} == exported[name]
    assert {k: v["resources"] for k, v in c.consumer_allocations(C1)["allocations"].items()} == {
        rp["gpu-01"]: {"VCPU": 2, "MEMORY_MB": 4096, "VGPU": 1, NIC_VF: 2}
    }

    again = _sync(run, placement.url, "--push-claims")
    assert again["resourceClasses"] == {"created": [], "existing": 1}
    assert (again["inventories"]["updated"], again["inventories"]["unchanged"]) == ([], 7)
    assert (again["claims"]["created"], again["claims"]["updated"], again["claims"]["unchanged"]) == (
        [], [], 1)
    assert (again["created"], again["updated"], again["deleted"], again["errors"]) == ([], [], [], [])


@pytest.mark.parametrize(
    ("text", "expected"), [("1.6", (1, 6)), ("1.7", (1, 7)), ("1.36", (1, 36)), ("latest", (10**6, 0))]
)
def test_microversions_compare_as_numbers(text: str, expected: tuple[int, int]) -> None:
    assert microversion_tuple(text) == expected
    assert (microversion_tuple(text) >= IDEMPOTENT_RESOURCE_CLASSES) == (text != "1.6")


def test_a_malformed_microversion_names_the_setting() -> None:
    with pytest.raises(InvalidInput, match=r"placement microversion: 'one\.seven'"):
        microversion_tuple("one.seven")


def test_custom_classes_are_those_of_pushed_inventories_and_claims() -> None:
    computed = {"a": {"VCPU": INV, NIC_VF: INV}, "b": {HUGEPAGES: INV, "VGPU": INV}}
    claimed = [[ResourceName("cpu"), ResourceName.parse("CUSTOM_FPGA")], [ResourceName("hugepages-1Gi")]]
    assert custom_classes(computed) == [HUGEPAGES, NIC_VF]
    assert custom_classes(computed, claimed) == ["CUSTOM_FPGA", "CUSTOM_HUGEPAGES_1GI", HUGEPAGES, NIC_VF]
    assert custom_classes({}, [[ResourceName("memory")]]) == []


# -- pure planning --------------------------------------------------------------------------

INV = {"total": 8, "reserved": 0, "min_unit": 1, "max_unit": 8, "step_size": 1, "allocation_ratio": 4.0}


@pytest.mark.parametrize(
    ("current", "nested", "expected"),
    [
        ({}, (), {"VCPU": INV}),
        ({"VCPU": INV}, (), None),
        # MySQL's single-precision ratio is the same ratio.
        ({"VCPU": {**INV, "allocation_ratio": 4.000000238}}, (), None),
        ({"VCPU": {**INV, "allocation_ratio": 1.0}}, (), {"VCPU": INV}),
        ({"VCPU": INV, "DISK_GB": {**INV, "total": 5}}, (), None),
        (
            {"VCPU": {**INV, "total": 4}, "DISK_GB": {**INV, "total": 5}},
            (),
            {"VCPU": INV, "DISK_GB": {**INV, "total": 5}},
        ),
        ({}, ("VCPU",), None),
    ],
)
def test_planned_inventories(
    current: dict[str, Any], nested: tuple[str, ...], expected: dict[str, Any] | None
) -> None:
    assert planned_inventories({"VCPU": INV}, current, nested) == expected


def test_plan_claims_puts_differences_deletes_own_leftovers_and_leaves_foreign_alone() -> None:
    want = {
        "c-new": {"rp": {"VCPU": 1}},
        "c-same": {"rp": {"VCPU": 2}},
        "c-grow": {"rp": {"VCPU": 3}},
        "c-nova": {"rp": {"VCPU": 1}},
    }
    states = {
        "c-same": ConsumerState({"rp": {"VCPU": 2}}, ME.project_id, ME.user_id, 1),
        "c-grow": ConsumerState({"rp": {"VCPU": 2}}, ME.project_id, ME.user_id, 1),
        "c-nova": ConsumerState({"rp": {"VCPU": 1}}, "nova", "u", 3),
        "c-ended": ConsumerState({"rp": {"VCPU": 1}}, ME.project_id, ME.user_id, 2),
        "c-other": ConsumerState({"rp": {"VCPU": 1}}, "nova", "u", 2),
        "c-empty": ConsumerState({}, None, None, None),
    }
    plan = plan_claims(want, states, ME)
    assert plan.put == {"c-new": {"rp": {"VCPU": 1}}, "c-grow": {"rp": {"VCPU": 3}}}
    assert plan.delete == ["c-ended"]
    assert (plan.unchanged, plan.foreign) == (1, ["c-nova"])


def test_claim_allocations_round_up_and_use_the_provider_that_has_the_class() -> None:
    tree = ProviderTree("hv", "root", ("root", "gpu"))
    classes = {"root": {"VCPU", "MEMORY_MB"}, "gpu": {"VGPU"}}
    res = {
        ResourceName("cpu"): Quantity(2),
        ResourceName("memory"): Quantity.parse("1025Ki"),
        ResourceName("VGPU"): Quantity(1),
    }
    assert claim_allocations(res, tree, classes) == {"root": {"VCPU": 2, "MEMORY_MB": 2}, "gpu": {"VGPU": 1}}
    with pytest.raises(Exception, match=r"resources\.CUSTOM_X: no provider of hv"):
        claim_allocations({ResourceName.parse("CUSTOM_X"): Quantity(1)}, tree, classes)


def test_an_overcommit_policy_reaches_placement_too(
    store: Store, run: Any, placement: RealPlacement, tmp_path: Path
) -> None:
    c = _fresh(placement)
    rp = _providers(c, store, "hv-a", "hv-b")
    (tmp_path / "p.yaml").write_text(
        "apiVersion: hvfleet.io/v1\nkind: OvercommitPolicy\nmetadata: {name: zone-x}\n"
        "spec: {selector: {matchLabels: {zone: x}}, overcommit: {cpu: 3, memory: 1.5}}\n"
    )
    assert run("apply", "-f", str(tmp_path / "p.yaml")).code == 0
    assert run("overcommit", "set", "hv-a", "memory=1.25").code == 0  # the host's own wins
    _sync(run, placement.url)
    inv_a, inv_b = c.inventories(rp["hv-a"])[1], c.inventories(rp["hv-b"])[1]
    assert (inv_a["VCPU"]["allocation_ratio"], inv_a["MEMORY_MB"]["allocation_ratio"]) == (3.0, 1.25)
    assert (inv_b["VCPU"]["allocation_ratio"], inv_b["MEMORY_MB"]["allocation_ratio"]) == (1.0, 1.0)
    assert rp["hv-a"] in _candidates(c, "VCPU:8") and len(_candidates(c, "VCPU:8")) == 2


def test_a_running_claims_invisible_part_stays_allocated(
    store: Store, run: Any, placement: RealPlacement
) -> None:
    """Once the instance runs, libvirt's allocation counts its cpu and memory, so
    the claim holds only its VGPU (`held_resources`), and so does Placement."""
    c = _fresh(placement)
    rp = _providers(c, store, "hv-a")
    gpu = _gpu_under(c, rp["hv-a"], "hv-a-pgpu0")
    assert run("reserve", "hv-a", "--cpu", "2", "--resource", "VGPU=1", "--consumer", C1).code == 0
    assert _sync(run, placement.url, "--push-claims")["claims"]["created"] == [C1]
    h = store.get_hypervisor("hv-a")
    vm = Instance(uuid=C1, name="vm-c1", state="running")
    status = h.status.model_copy(update={"instances": [vm]})
    store.update(h.model_copy(update={"status": status}), agent_manager("hv-a"))
    report = _sync(run, placement.url, "--push-claims")
    assert report["claims"]["updated"] == [C1]
    assert {k: v["resources"] for k, v in c.consumer_allocations(C1)["allocations"].items()} == {
        gpu: {"VGPU": 1}
    }
    assert report["created"] == []  # still hvfleet's own claim: not mirrored
    assert run("reservations", "gc").code == 0  # records Confirmed while the VGPU is held
    store.update(store.get_hypervisor("hv-a").model_copy(update={"status": h.status}), agent_manager("hv-a"))
    # The instance is gone again: the claim is Confirmed and holds nothing.
    assert _sync(run, placement.url, "--push-claims")["claims"]["deleted"] == [C1]


# -- properties of the planning: applying a plan leaves nothing to do ----------------------

_classes = st.sampled_from(["VCPU", "MEMORY_MB", "DISK_GB", "VGPU", "CUSTOM_NIC_VF"])
_inventory = st.fixed_dictionaries(
    {
        "total": st.integers(1, 10_000),
        "reserved": st.integers(0, 10),
        "min_unit": st.integers(1, 4),
        "max_unit": st.integers(1, 10_000),
        "step_size": st.integers(1, 4),
        "allocation_ratio": st.sampled_from([0.5, 1.0, 1.1, 1.5, 4.0, 16.0]),
    }
)


@given(
    st.dictionaries(_classes, _inventory, max_size=4),
    st.dictionaries(_classes, _inventory, max_size=4),
    st.sets(_classes, max_size=2),
)
def test_an_applied_inventory_plan_leaves_nothing_to_do(
    computed: dict[str, Any], current: dict[str, Any], nested: set[str]
) -> None:
    plan = planned_inventories(computed, current, nested)
    after = current if plan is None else plan
    assert planned_inventories(computed, after, nested) is None
    # Classes hvfleet does not compute, and nested ones, are never dropped or changed.
    for cls, inv in current.items():
        if cls not in computed or cls in nested:
            assert after[cls] == inv


_allocs = st.dictionaries(
    st.sampled_from(["rp-a", "rp-b"]),
    st.dictionaries(_classes, st.integers(1, 64), min_size=1, max_size=3),
    min_size=1,
    max_size=2,
)
_owner = st.sampled_from([(ME.project_id, ME.user_id), ("nova", "u")])


@given(
    st.dictionaries(st.sampled_from(["c1", "c2", "c3", "c4"]), _allocs, max_size=4),
    st.dictionaries(st.sampled_from(["c1", "c2", "c3", "c4", "c5"]), st.tuples(_allocs, _owner), max_size=5),
)
def test_an_applied_claim_plan_leaves_nothing_to_do(
    desired: dict[str, Any], placed: dict[str, tuple[Any, tuple[str, str]]]
) -> None:
    states = {c: ConsumerState(a, p, u, 1) for c, (a, (p, u)) in placed.items()}
    plan = plan_claims(desired, states, ME)
    after = dict(states)
    for c, allocations in plan.put.items():
        after[c] = ConsumerState(allocations, ME.project_id, ME.user_id, 2)
    for c in plan.delete:
        after[c] = ConsumerState({}, ME.project_id, ME.user_id, 2)
    again = plan_claims(desired, after, ME)
    assert (again.put, again.delete) == ({}, [])
    # Another project's consumers are never written.
    assert not {c for c in [*plan.put, *plan.delete] if states.get(c) and states[c].project_id == "nova"}
