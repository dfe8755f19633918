"""Numbers at the edge of what is accepted, through a real `hvfleet serve`:
a Hypervisor whose status holds the most the model takes (10**21 CPUs,
10**21 bytes, with VGPU beyond libvirt at the same bound), a client's
provider at the largest allocation ratio Placement's schema takes, and
queries asking for more than any int64. Each was accepted when written,
and each made every `allocation_candidates` answer of the fleet a 500 (an
int64 column overflowed): now every reader answers, the numbers shown as
they are."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from tests.placement.support import Placement, _served_sqlite, _uuid
from tests.scheduling.sched_fleet import host, put_host

HUGE = 10**21  # hvfleet.model.bounds.MAX_QUANTITY


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    yield from _served_sqlite()


def _ok(r: requests.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def test_every_reader_answers_at_the_largest_numbers_a_write_accepts(api: Placement) -> None:
    put_host(api.store, host("huge", {"cpu": HUGE, "memory": HUGE}, extra={"VGPU": HUGE},
                             overcommit={"cpu": 1000.0, "memory": 1000.0}, beat=datetime.now(UTC)))
    huge = _uuid(api.store, "huge")
    wide = str(uuid.uuid4())
    _ok(api.call("POST", "/resource_providers", body={"name": "wide", "uuid": wide}))
    _ok(api.call("PUT", f"/resource_providers/{wide}/inventories", body={
        "resource_provider_generation": 0, "inventories": {"DISK_GB": {
            "total": 2147483647, "allocation_ratio": 3.40282e38}}}))
    inv = _ok(api.call("GET", f"/resource_providers/{huge}/inventories"))["inventories"]
    assert inv["VCPU"]["total"] == HUGE and inv["VGPU"]["total"] == HUGE

    consumer = str(uuid.uuid4())
    _ok(api.call("PUT", f"/allocations/{consumer}", "scheduler", body={
        "allocations": {huge: {"resources": {"VCPU": 2147483647, "VGPU": 2147483647}},
                        wide: {"resources": {"DISK_GB": 2147483647}}},
        "project_id": "p", "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"}), 204)

    for query, providers in [("VCPU:1", {huge, _uuid(api.store, "hv1"), _uuid(api.store, "hv2")}),
                             ("VGPU:2147483647", {huge}), ("DISK_GB:2147483647", {wide}),
                             ("MEMORY_MB:1,DISK_GB:1", set()),
                             ("VCPU:9223372036854775808", {huge}),  # 2**63: within its max_unit
                             ("VCPU:" + "9" * 22, set()), ("VGPU:" + "9" * 400, set())]:
        got = _ok(api.call("GET", f"/allocation_candidates?resources={query}"))
        assert {u for ar in got["allocation_requests"] for u in ar["allocations"]} == providers, query
    summary = _ok(api.call("GET", "/allocation_candidates?resources=DISK_GB:1"))["provider_summaries"]
    assert summary[wide]["resources"]["DISK_GB"] == {
        "capacity": int(2147483647 * 3.40282e38), "used": 2147483647}
    assert _ok(api.call("GET", f"/resource_providers/{huge}/usages"))["usages"]["VCPU"] >= 2147483647


def test_a_list_past_what_a_provider_may_hold_is_placements_400_and_writes_nothing(api: Placement) -> None:
    """More aggregates or traits than a provider's record holds (4096, the
    bound of every list hvfleet stores) were refused with the Kubernetes
    API's 422 Status, a body no Placement client reads; now Placement's 400,
    in its error body, naming the bound."""
    rp = str(uuid.uuid4())
    _ok(api.call("POST", "/resource_providers", body={"name": f"lists-{rp[:8]}", "uuid": rp}))
    r = api.call("PUT", f"/resource_providers/{rp}/aggregates", body={
        "resource_provider_generation": 0, "aggregates": [str(uuid.uuid4()) for _ in range(4097)]})
    assert r.status_code == 400, r.text[:300]
    (err,) = r.json()["errors"]
    assert err["status"] == 400 and "4096 aggregates" in err["detail"], err
    traits = [f"CUSTOM_MANY_{i}" for i in range(4097)]
    for t in traits:
        assert api.call("PUT", f"/traits/{t}").status_code in (201, 204)
    r = api.call("PUT", f"/resource_providers/{rp}/traits", body={
        "resource_provider_generation": 0, "traits": traits})
    assert r.status_code == 400 and "4096 traits" in r.json()["errors"][0]["detail"], r.text[:300]
    after = _ok(api.call("GET", f"/resource_providers/{rp}"))
    assert after["generation"] == 0
    assert _ok(api.call("GET", f"/resource_providers/{rp}/traits"))["traits"] == []


def test_more_inventories_than_a_provider_may_hold_is_placements_400(api: Placement) -> None:
    rp = str(uuid.uuid4())
    _ok(api.call("POST", "/resource_providers", body={"name": f"classes-{rp[:8]}", "uuid": rp}))
    classes = [f"CUSTOM_WIDE_{i}" for i in range(129)]  # past MAX_RESOURCES
    for c in classes:
        assert api.call("PUT", f"/resource_classes/{c}").status_code in (201, 204)
    r = api.call("PUT", f"/resource_providers/{rp}/inventories", body={
        "resource_provider_generation": 0, "inventories": {c: {"total": 1} for c in classes}})
    assert r.status_code == 400 and r.json()["errors"][0]["status"] == 400, r.text[:300]
    assert _ok(api.call("GET", f"/resource_providers/{rp}/inventories"))["inventories"] == {}


@pytest.mark.parametrize("name", ["CUSTOM_" + "A" * 248, "CUSTOM_" + "B" * 231, "CUSTOM_FOO_", "CUSTOM__"])
def test_every_custom_name_placement_takes_is_taken_used_and_deleted(api: Placement, name: str) -> None:
    """Placement 16.0 takes any CUSTOM_[A-Z0-9_]+ of up to 255 characters
    (201 for each of these). Their records' store names were the name
    spelled in lower case with '-' for '_': past 253 characters, or ending in
    '-', no store name at all, and the PUT was a 500."""
    for of, path in (("trait", "/traits"), ("resource class", "/resource_classes")):
        _ok(api.call("PUT", f"{path}/{name}"), 201)
        _ok(api.call("PUT", f"{path}/{name}"), 204)  # it exists
        _ok(api.call("GET", f"{path}/{name}"), 204 if of == "trait" else 200)
    rp = str(uuid.uuid4())
    _ok(api.call("POST", "/resource_providers", body={"name": f"named-{rp[:8]}", "uuid": rp}))
    _ok(api.call("PUT", f"/resource_providers/{rp}/inventories", body={
        "resource_provider_generation": 0, "inventories": {name: {"total": 4}}}))
    _ok(api.call("PUT", f"/resource_providers/{rp}/traits", body={
        "resource_provider_generation": 1, "traits": [name]}))
    got = _ok(api.call("GET", f"/allocation_candidates?resources={name}:1&required={name}"))
    assert [list(ar["allocations"]) for ar in got["allocation_requests"]] == [[rp]]
    assert name in _ok(api.call("GET", "/traits?name=startswith:CUSTOM_"))["traits"]
    _ok(api.call("DELETE", f"/resource_providers/{rp}"), 204)
    for path in ("/traits", "/resource_classes"):
        _ok(api.call("DELETE", f"{path}/{name}"), 204)
        _ok(api.call("GET", f"{path}/{name}"), 404)
