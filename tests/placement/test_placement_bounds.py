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
