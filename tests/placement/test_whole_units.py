"""Whole Placement units, one truth at the margin (probe 14): a reserve of
500m cpu under a ratio of 16 made `fit` and `hvfleet reserve` count
(4 − 0.5) × 16 = 56 vCPUs where the served Placement counted (4 − 1) × 16 = 48,
so reservations pushed its usage to 54 of 48. Capacity is now counted as
Placement counts it (total down, reserve up, every use up, in whole units of
the resource's class); a new amount that is not whole units is refused where it
is first given; one stored before is read rounded, and fit, claims and the
served Placement agree on it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from hvfleet.model.capacity import held_resources
from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import Hypervisor, Reservation
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.scheduling.claims import reserve
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.placement import export_inventories, export_usages, provider_uuid
from hvfleet.scheduling.request import parse_request
from tests.placement.support import Placement, _served_sqlite
from tests.scheduling.sched_fleet import OPERATOR, host, put_host
from tests.store.poison import poison

CPU, MEMORY = ResourceName.parse("cpu"), ResourceName.parse("memory")


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    yield from _served_sqlite(seeded=False)


def _store_url(api: Placement) -> str:
    return api.store.url  # type: ignore[attr-defined,no-any-return]


def _fractional_host(api: Placement, name: str) -> Hypervisor:
    """A host whose spec an older hvfleet stored with a reserve of 500m cpu
    (refused today), with 10^9 bytes of memory (953.67 MiB) and an
    allocation of 100,000 KiB (97.66 MiB), as libvirt counts them."""
    put_host(api.store, host(name, {"cpu": 4, "memory": 10**9}, allocation={"memory": 100_000 * 1024},
                             overcommit={"cpu": 16}, beat=datetime.now(UTC)))
    doc = json.loads(api.store.get_hypervisor(name).model_dump_json(by_alias=True, exclude_none=True))
    doc["spec"]["reserved"] = {"cpu": "500m"}
    poison(_store_url(api), "Hypervisor", name, doc)
    h = api.store.get_hypervisor(name)
    assert h.spec.reserved[CPU] == Quantity.parse("500m")
    return h


def test_fit_claims_and_the_served_placement_agree_on_a_reserve_stored_fractional(api: Placement) -> None:
    h = _fractional_host(api, "frac")
    inv = export_inventories(h)
    assert inv["VCPU"]["total"] == 4 and inv["VCPU"]["reserved"] == 1
    assert inv["MEMORY_MB"]["total"] == 953
    index = FleetIndex()
    index.load_from(api.store)
    # (4 − ⌈0.5⌉) × 16 = 48 vCPUs, as Placement's (total − reserved) × ratio; memory
    # ⌊953.67⌋ − ⌈97.66⌉ = 953 − 98 = 855 MiB.
    assert index.free("frac")[CPU] == 48
    assert index.free("frac")[MEMORY] == 855 * 2**20
    served = api.call("GET", "/allocation_candidates?resources=VCPU:3,MEMORY_MB:855").json()
    assert served["provider_summaries"][provider_uuid(h)]["resources"]["VCPU"]["capacity"] == 48
    over = api.call("GET", "/allocation_candidates?resources=MEMORY_MB:856").json()
    assert over["provider_summaries"] == {}
    # 16 claims of 3 vCPUs through Placement fill it: the 17th, fit and a reserve all say no.
    rp = provider_uuid(h)
    body = {"allocations": {rp: {"resources": {"VCPU": 3}}}, "project_id": "p", "user_id": "u",
            "consumer_generation": None, "consumer_type": "INSTANCE"}
    for _ in range(16):
        r = api.call("PUT", f"/allocations/{uuid.uuid4()}", "scheduler", body)
        assert r.status_code == 204, r.text
    r = api.call("PUT", f"/allocations/{uuid.uuid4()}", "scheduler", body)
    assert r.status_code == 409 and "exceed" in r.text, r.text
    index.load_from(api.store)
    assert index.free("frac")[CPU] == 0
    assert "frac" not in index.fit(parse_request("1", None)).names
    with pytest.raises(DoesNotFit):
        reserve(api.store, "frac", parse_request("1", None), str(uuid.uuid4()))
    usages = api.call("GET", f"/resource_providers/{rp}/usages").json()["usages"]
    assert usages["VCPU"] == 48 and usages["MEMORY_MB"] == 98


@pytest.mark.parametrize(("field", "amount"), [("cpu", "500m"), ("memory", "100M"), ("disk", "1500Mi"),
                                               ("VGPU", "1500m")])
def test_a_new_amount_that_is_not_whole_units_is_refused_where_it_is_given(
        api: Placement, field: str, amount: str) -> None:
    name = f"w-{field.lower()}"
    put_host(api.store, host(name, {"cpu": 8, "memory": "8Gi", "disk": "100Gi"}, extra={"VGPU": 4},
                             beat=datetime.now(UTC)))
    before = api.store.revision()
    r = ResourceName.parse(field)
    stored = api.store.get_hypervisor(name)
    spec = stored.spec.model_copy(update={"reserved": {r: Quantity.parse(amount)}})
    with pytest.raises(InvalidInput) as reserved:
        api.store.update(stored.model_copy(update={"spec": spec}), OPERATOR)
    assert reserved.value.field == f"spec.reserved.{field}" and "whole number" in str(reserved.value)
    request = (parse_request(amount if field == "cpu" else None, amount if field == "memory" else None)
               if field in ("cpu", "memory") else parse_request(None, None, [f"{field}={amount}"]))
    with pytest.raises(InvalidInput) as claimed:
        reserve(api.store, name, request, str(uuid.uuid4()))
    assert claimed.value.field == f"spec.resources.{field}"
    assert api.store.revision() == before


def test_a_reserve_stored_fractional_stays_through_an_edit_of_something_else(api: Placement) -> None:
    h = _fractional_host(api, "keep")
    edited = h.model_copy(update={"spec": h.spec.model_copy(update={"maintenance": "manual",
                                                                     "maintenance_reason": "disk"})})
    out = api.store.update(edited, OPERATOR)
    assert isinstance(out, Hypervisor) and out.spec.reserved[CPU] == Quantity.parse("500m")


def test_usages_are_the_sum_of_each_claims_whole_units() -> None:
    """Two claims of 500m cpu stored before claims had to be whole units: each
    is one VCPU in Placement (its allocation), so the usage is 2, not ⌈1⌉ = 1."""
    h = host("u", {"cpu": 8}, allocation={"cpu": 1})
    now = datetime.now(UTC)
    claims = [Reservation.model_validate({
        "metadata": {"name": f"c{i}"},
        "spec": {"hypervisor": "u", "consumer": str(uuid.uuid4()), "resources": {"cpu": "500m"},
                 "expiresAt": (now + timedelta(hours=1)).isoformat()},
        "status": {"phase": "Active"}}) for i in range(2)]
    assert export_usages(h, claims, now) == {"VCPU": 3}
    # What each holds, as every view shows it, is what is counted: one VCPU.
    assert [held_resources(c, h, now) for c in claims] == [{CPU: Quantity(1)}] * 2
    index = FleetIndex()
    index.load([h], claims, now=now)
    assert index.free("u")[CPU] == 8 - 1 - 2


def test_a_claim_beside_a_placement_clients_allocations_is_refused(api: Placement) -> None:
    """Probe 14: `hvfleet reserve` for a consumer a Placement client allocated
    for added a claim without moving the consumer generation that client
    writes against; its next PUT, from what it had read, replaced the claim
    without a conflict. Such a consumer's allocations change through Placement."""
    from hvfleet.model.errors import Conflict

    for name in ("pc1", "pc2"):
        put_host(api.store, host(name, {"cpu": 8, "memory": "8Gi"}, beat=datetime.now(UTC)))
    consumer = str(uuid.uuid4())
    body = {"allocations": {provider_uuid(api.store.get_hypervisor("pc1")): {"resources": {"VCPU": 1}}},
            "project_id": "p", "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}
    assert api.call("PUT", f"/allocations/{consumer}", "scheduler", body).status_code == 204
    before = api.store.revision()
    with pytest.raises(Conflict, match="Placement API"):
        reserve(api.store, "pc2", parse_request("1", None), consumer)
    assert api.store.revision() == before
    shown = api.call("GET", f"/allocations/{consumer}").json()
    assert shown["consumer_generation"] == 1 and len(shown["allocations"]) == 1
    # Once its allocations are gone, the consumer may be claimed for here.
    assert api.call("DELETE", f"/allocations/{consumer}", "scheduler").status_code == 204
    made = reserve(api.store, "pc2", parse_request("1", None), consumer)
    assert made.spec.consumer == consumer
