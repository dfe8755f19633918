"""What `placement sync --push-claims` writes makes a real Placement answer as
hvfleet does: on random fleets (host ratios, OvercommitPolicies with
priorities, reserves, hvfleet claims) pushed into empty providers, the hosts
`hvfleet fit` returns equal the providers in Placement's
GET /allocation_candidates, for random requests, many aimed at a host's exact
free amount. Then a fleet-wide `overcommit set -l` and a second sync, and the
same comparison again.

Libvirt's allocation is left at 0 here: Placement learns of running guests
from their owner (nova), not from hvfleet, so only inventories and claims are
compared. Some hosts have NIC VFs (`CUSTOM_NIC_VF` extra capacity), which
Placement accepts only once sync has created the class; claims and requests
then ask for VFs too. HVFLEET_PUSH_FLEETS × 25 requests (6 × 25 by default).
"""

from __future__ import annotations

import os
import random
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from placement_fleets import float_boundary_diverges
from real_placement import RealPlacement
from sched_fleet import host, now, put_host

from hvfleet.model import ResourceName
from hvfleet.model.capacity import max_unit, overcommit_ratios
from hvfleet.model.hypervisor import OvercommitPolicy
from hvfleet.model.spec_edits import SpecEdit
from hvfleet.scheduling.claims import reserve
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.fleet_edit import edit_hosts
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.placement import placement_resources, provider_uuid, sync
from hvfleet.scheduling.placement_client import PlacementClient
from hvfleet.scheduling.request import Request, parse_request
from hvfleet.store import Store, open_store

FLEETS = int(os.environ.get("HVFLEET_PUSH_FLEETS", "6"))
REQUESTS = 25
RATIOS = [0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0]
ROLES = ["compute", "gpu", "edge"]
CPU, MEM = ResourceName("cpu"), ResourceName("memory")
NIC_VF = ResourceName.parse("CUSTOM_NIC_VF")


@pytest.fixture(scope="module")
def placement() -> Iterator[RealPlacement]:
    with RealPlacement() as p:
        yield p


def _clear(c: PlacementClient) -> None:
    for rp in c.get("/resource_providers")["resource_providers"]:
        for consumer in c.get(f"/resource_providers/{rp['uuid']}/allocations")["allocations"]:
            c.delete_allocations(consumer)
        c.request("DELETE", f"/resource_providers/{rp['uuid']}")


def _fleet(rng: random.Random, store: Store) -> None:
    for i in range(rng.randint(4, 12)):
        own = {r: rng.choice(RATIOS) for r in ("cpu", "memory") if rng.random() < 0.4}
        put_host(
            store,
            host(
                f"h-{i:02d}",
                {"cpu": rng.randint(2, 64), "memory": f"{rng.randint(1, 64) * 1024}Mi"},
                reserved={"cpu": rng.randint(0, 1), "memory": f"{rng.choice([0, 512, 1024])}Mi"},
                overcommit=own,
                labels={"role": rng.choice(ROLES)},
                extra={str(NIC_VF): rng.randint(1, 32)} if rng.random() < 0.4 else None,
                beat=now(),
            ),
        )
    for j in range(rng.randint(0, 4)):
        sel = {} if rng.random() < 0.3 else {"matchLabels": {"role": rng.choice(ROLES)}}
        ratios = {r: rng.choice(RATIOS) for r in ("cpu", "memory") if rng.random() < 0.7} or {"cpu": 2.0}
        store.create(
            OvercommitPolicy.model_validate(
                {
                    "metadata": {"name": f"p-{j}"},
                    "spec": {"selector": sel, "overcommit": ratios, "priority": rng.randint(-1, 2)},
                }
            ),
            "operator",
        )


def _avoids_float_boundaries(store: Store) -> bool:
    """Placement multiplies binary floats; hvfleet the decimals written
    (the documented divergence): keep fleets clear of it."""
    policies = store.list_overcommit_policies()
    for h in store.list_hypervisors():
        ratios = overcommit_ratios(h, policies)
        for r, usable in max_unit(h).items():
            units = int(usable.value / r.placement.base_per_unit)
            if float_boundary_diverges(units, ratios.get(r, 1.0)):
                return False
    return True


def _claims(rng: random.Random, store: Store) -> int:
    made = 0
    for h in store.list_hypervisors():
        for _ in range(rng.randint(0, 3)):
            cpu, mem = rng.randint(1, 16), rng.randint(1, 16) * 512
            vfs = [f"{NIC_VF}={rng.randint(1, 8)}"] if NIC_VF in h.spec.extra_capacity else []
            try:
                reserve(store, h.name, parse_request(str(cpu), f"{mem}Mi", vfs), str(uuid.uuid4()), None)
                made += 1
            except DoesNotFit:
                pass
    return made


def _request(rng: random.Random, index: FleetIndex, hosts: list[str]) -> Request:
    h = index.host(rng.choice(hosts))
    assert h is not None
    free = index.free(h.name)
    cpu = (
        max(1, int(free.get(CPU, 0)) + rng.choice([-1, 0, 0, 1]))
        if rng.random() < 0.5
        else rng.randint(1, 32)
    )
    mem_free = int(free.get(MEM, 0) / 2**20)
    mem = max(1, mem_free + rng.choice([-1, 0, 1])) if rng.random() < 0.3 else rng.randint(1, 32768)
    vfs = []
    if rng.random() < 0.3:
        near = int(free.get(NIC_VF, 0)) + rng.choice([-1, 0, 1])
        vfs = [f"{NIC_VF}={max(1, near) if rng.random() < 0.5 else rng.randint(1, 32)}"]
    return parse_request(str(cpu), f"{mem}Mi" if rng.random() < 0.7 else None, vfs)


def _compare(rng: random.Random, store: Store, c: PlacementClient, seed: int) -> list[str]:
    index = FleetIndex.from_store(store)
    names = {provider_uuid(h): h.name for h in store.list_hypervisors()}
    out = []
    for case in range(REQUESTS):
        request = _request(rng, index, sorted(names.values()))
        mine = set(index.fit(request).names)
        q = ",".join(f"{k}:{v}" for k, v in sorted(placement_resources(request).items()))
        doc = c.get("/allocation_candidates?" + urllib.parse.urlencode({"resources": q}))
        theirs = {names[u] for ar in doc["allocation_requests"] for u in ar["allocations"]}
        if mine != theirs:
            out.append(
                f"seed={seed} case={case} {q}: only hvfleet {sorted(mine - theirs)}, "
                f"only placement {sorted(theirs - mine)}"
            )
    return out


def test_pushed_inventories_and_claims_make_placement_answer_as_fit(
    placement: RealPlacement, tmp_path: Path
) -> None:
    c = placement.client()
    mismatches: list[str] = []
    compared = claims = 0
    seed = 20261201
    while compared < FLEETS:
        seed += 1
        rng = random.Random(seed)
        with open_store(f"sqlite:///{tmp_path}/f{seed}.db") as store:
            _fleet(rng, store)
            if not _avoids_float_boundaries(store):
                continue
            _clear(c)
            for h in store.list_hypervisors():
                c.request("POST", "/resource_providers", {"name": h.name, "uuid": provider_uuid(h)})
            claims += _claims(rng, store)
            report = sync(store, c, push_claims=True)
            assert report.errors == [], report.errors
            mismatches += _compare(rng, store, c, seed)
            # A fleet-wide ratio change, pushed by the next sync.
            role = rng.choice(ROLES)
            if store.list_hypervisors(f"role={role}"):
                edit_hosts(
                    store,
                    SpecEdit("overcommit", {CPU: rng.choice(RATIOS)}),
                    "operator",
                    selector=f"role={role}",
                    force=True,
                )
            if _avoids_float_boundaries(store):
                assert sync(store, c, push_claims=True).errors == []
                mismatches += _compare(rng, store, c, seed)
            compared += 1
    print(f"\npush differential: {compared} fleets, {claims} claims pushed, {len(mismatches)} mismatches")
    assert claims > 0
    assert not mismatches, "\n".join(mismatches[:20])
