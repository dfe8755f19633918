"""A claim made through the Placement API (`PUT /placement/allocations/{consumer}`,
what Nova's scheduler sends, with a token in `X-Auth-Token`) is an hvfleet
claim at once everywhere: the open dashboard's row and host page, and the
`hvfleet capacity`, `fit` and `reservations` processes; its DELETE frees the
space in all of them. The session's real `hvfleet serve` and fleet (issue 18,
"One truth, not two copies")."""

from __future__ import annotations

import json
import uuid
from typing import Any

from hvfleet.store import open_store
from tests.dashboard.fleet import Fleet, hvfleet, login

HOST = "compute-01"
CELL = f"tr[data-host='{HOST}'] .res[data-resource='cpu']"


def _placement(fleet: Fleet, method: str, path: str, body: Any = None) -> Any:
    http = fleet.http()
    http.headers.update({"X-Auth-Token": fleet.tokens["admin"], "OpenStack-API-Version": "placement 1.39",
                         "Accept": "application/json"})
    return http.request(method, f"{fleet.url}/placement{path}", json=body, timeout=30)


def _cli(fleet: Fleet) -> tuple[str, list[str], list[str], list[str]]:
    """What the CLI processes say of HOST: its free cpu, the names `fit`
    gives for exactly that much cpu and for one more, and the consumers of
    its reservations."""
    capacity = json.loads(hvfleet("capacity", "-o", "json", "--store", fleet.store_url).stdout)
    free = next(h for h in capacity["hosts"] if h["name"] == HOST)["free"]["cpu"]

    def fits(cpu: int) -> list[str]:
        out = hvfleet("fit", "--cpu", str(cpu), "-o", "json", "--store", fleet.store_url, check=False)
        return [c["name"] for c in json.loads(out.stdout)["candidates"]]

    listed = json.loads(hvfleet("reservations", "-o", "json", "--store", fleet.store_url).stdout)
    consumers = [r["spec"]["consumer"] for r in listed["items"] if r["spec"]["hypervisor"] == HOST]
    return free, fits(int(free)), fits(int(free) + 1), consumers


def test_a_placement_claim_shows_at_once_in_the_dashboard_capacity_fit_and_reservations(
        fleet: Fleet, page: Any) -> None:
    login(page, fleet, fleet.tokens["viewer"], "/?perPage=1000")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#live-status:has-text('on')")
    before = page.get_attribute(CELL, "data-free")
    free, fits_all, fits_more, consumers = _cli(fleet)
    assert free == before and HOST in fits_all and HOST not in fits_more and consumers == []

    with open_store(fleet.store_url) as s:
        provider = s.get_hypervisor(HOST).metadata.uid
    consumer = str(uuid.uuid4())
    r = _placement(fleet, "PUT", f"/allocations/{consumer}", {
        "allocations": {provider: {"resources": {"VCPU": 2, "MEMORY_MB": 1024}}},
        "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
        "consumer_generation": None, "consumer_type": "INSTANCE"})
    assert r.status_code == 204, r.text
    want = str(int(before) - 2)
    page.wait_for_function(f"document.querySelector(\"{CELL}\").dataset.free === '{want}'", timeout=2000)
    free, fits_all, fits_more, consumers = _cli(fleet)
    assert (free, consumers) == (want, [consumer])
    assert HOST in fits_all and HOST not in fits_more
    usages = _placement(fleet, "GET", f"/resource_providers/{provider}/usages").json()["usages"]
    assert usages["VCPU"] >= 2 and usages["MEMORY_MB"] >= 1024

    # The host's page lists it as a reservation of that consumer, holding the 2 cpus.
    login(page, fleet, fleet.tokens["viewer"], f"/hosts/{HOST}")
    page.wait_for_selector(f"#live:has-text('{consumer}')", timeout=5000)
    assert "+ 2 held" in page.locator(".bars .res").first.inner_text()

    assert _placement(fleet, "DELETE", f"/allocations/{consumer}").status_code == 204
    login(page, fleet, fleet.tokens["viewer"], "/?perPage=1000")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_function(f"document.querySelector(\"{CELL}\").dataset.free === '{before}'", timeout=2000)
    free, fits_all, fits_more, consumers = _cli(fleet)
    assert (free, consumers) == (before, [])
