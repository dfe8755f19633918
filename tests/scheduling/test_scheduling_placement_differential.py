"""hvfleet's fit and claims against a real OpenStack Placement, case by case.

Each fleet (5–50 hosts, random totals, reserves, ratios including fractional
and below 1, usages, min_unit/step_size, missing classes, reservations in every
phase) is loaded into hvfleet and into Placement; then random requests, many of
them aimed exactly at a host's last free unit, are asked of both:
- the hosts `hvfleet fit` returns (the fleet index) == the providers in
  Placement's GET /allocation_candidates;
- a claim on a host succeeds in hvfleet (the check `Store.claim` runs) exactly
  when Placement accepts PUT /allocations for it (the claim then stays, on
  both sides, for the next case).
HVFLEET_PLACEMENT_FLEETS × HVFLEET_PLACEMENT_REQUESTS cases (12 × 40 = 480 by
default); HVFLEET_PLACEMENT_SEED replays a single fleet printed in a failure.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from placement_fleets import (
    NAME,
    Fleet,
    PlacementPool,
    float_boundary_diverges,
    random_fleet,
    to_hvfleet,
    units_free,
)
from real_placement import RealPlacement
from sched_fleet import NOW, host, reservation

from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.fit import check_claim
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.placement import placement_resources
from hvfleet.scheduling.request import Request, parse_request
from hvfleet.store.base import WatchEvent

FLEETS = int(os.environ.get("HVFLEET_PLACEMENT_FLEETS", "12"))
REQUESTS = int(os.environ.get("HVFLEET_PLACEMENT_REQUESTS", "40"))
BASE_SEED = 20261129


@pytest.fixture(scope="module")
def placement() -> Iterator[RealPlacement]:
    with RealPlacement() as p:
        yield p


def random_request(rng: random.Random, fleet: Fleet, index: FleetIndex) -> dict[str, int]:
    """Placement units per class; often exactly a random host's free amount (±1)."""
    classes = [c for c in fleet.classes if rng.random() < (0.9 if c == "VCPU" else 0.6)]
    if not classes:
        classes = [rng.choice(fleet.classes)]
    out: dict[str, int] = {}
    for cls in classes:
        if rng.random() < 0.5:
            h = rng.choice(fleet.hosts)
            free = units_free(index.host(h.name), index.free(h.name), cls)  # type: ignore[arg-type]
            out[cls] = max(1, free + rng.choice([-1, 0, 0, 1]))
        else:
            out[cls] = {
                "VCPU": lambda: rng.choice([1, 2, 4, 8, 16, rng.randint(1, 64)]),
                "MEMORY_MB": lambda: rng.choice([512, 1024, 4096, rng.randint(1, 65536)]),
                "DISK_GB": lambda: rng.randint(1, 500),
                "CUSTOM_NIC_VF": lambda: rng.randint(1, 8),
            }[cls]()
    return out


def as_request(resources: dict[str, int]) -> Request:
    suffix = {"VCPU": "", "MEMORY_MB": "Mi", "DISK_GB": "Gi", "CUSTOM_NIC_VF": ""}
    cpu = resources.get("VCPU")
    mem = resources.get("MEMORY_MB")
    other = [f"{NAME[c]}={a}{suffix[c]}" for c, a in resources.items() if c in ("DISK_GB", "CUSTOM_NIC_VF")]
    return parse_request(None if cpu is None else str(cpu), None if mem is None else f"{mem}Mi", other)


@dataclass
class Tally:
    cases: int = 0
    fits: int = 0
    claims_ok: int = 0
    avoided: int = 0
    mismatches: list[str] = field(default_factory=list)


def run_fleets(placement: RealPlacement, seeds: list[int], tally: Tally) -> None:
    pool = PlacementPool(placement.client(), 50)
    for seed in seeds:
        fleet = random_fleet(seed)
        tally.avoided += fleet.avoided_boundaries
        hosts, reservations = to_hvfleet(fleet)
        pool.load(fleet)
        index = FleetIndex()
        index.load(hosts, reservations, now=NOW)
        rng = random.Random(seed * 7919)
        for case in range(REQUESTS):
            tally.cases += 1
            resources = random_request(rng, fleet, index)
            request = as_request(resources)
            assert placement_resources(request) == resources
            mine = {int(c.name[1:]) for c in index.fit(request, now=NOW).candidates}
            theirs = pool.candidates(resources)
            tally.fits += len(mine)
            if mine != theirs:
                tally.mismatches.append(
                    f"seed={seed} case={case} fit {resources}: only hvfleet "
                    f"{sorted(mine - theirs)}, only placement {sorted(theirs - mine)}"
                )
            # A claim on a host that fits (per hvfleet) or on any host.
            pick_fitting = mine and rng.random() < 0.6
            row = rng.choice(sorted(mine)) if pick_fitting else rng.randrange(len(hosts))
            h = index.host(fleet.hosts[row].name)
            assert h is not None
            consumer = str(uuid.UUID(int=rng.getrandbits(128)))
            try:
                check_claim(h, index.reservations_of(h.name), request, NOW)
                ours = True
            except DoesNotFit:
                ours = False
            theirs_ok = pool.claim(row, resources, consumer)
            if ours != theirs_ok:
                tally.mismatches.append(
                    f"seed={seed} case={case} claim {resources} on {h.name}: "
                    f"hvfleet {'accepts' if ours else 'refuses'}, "
                    f"placement {'accepts' if theirs_ok else 'refuses'}"
                )
            if ours and theirs_ok:
                tally.claims_ok += 1
                r = reservation(
                    f"claim-{seed}-{case}",
                    h.name,
                    {str(k): str(v) for k, v in request.total_list().items()},
                    consumer=consumer,
                    expires_in=timedelta(hours=1),
                )
                index.apply(WatchEvent("ADDED", r, index.revision + 1), now=NOW)


def test_fit_and_claims_equal_real_placement(placement: RealPlacement) -> None:
    if "HVFLEET_PLACEMENT_SEED" in os.environ:
        seeds = [int(os.environ["HVFLEET_PLACEMENT_SEED"])]
    else:
        seeds = [BASE_SEED + i for i in range(FLEETS)]
    tallies = [Tally()]
    run_fleets(placement, seeds, tallies[0])
    cases = sum(t.cases for t in tallies)
    mismatches = [m for t in tallies for m in t.mismatches]
    print(
        f"\nplacement differential: {cases} cases over {len(seeds)} fleets, "
        f"{sum(t.fits for t in tallies)} host fits, "
        f"{sum(t.claims_ok for t in tallies)} claims accepted by both, "
        f"{sum(t.avoided for t in tallies)} float-boundary ratios avoided, "
        f"{len(mismatches)} mismatches"
    )
    assert not mismatches, "\n".join(sorted(mismatches)[:30])
    assert cases == len(seeds) * REQUESTS


def test_float_ratio_boundary_is_the_one_documented_divergence(placement: RealPlacement) -> None:
    """100 vCPU × 0.29 is 29 written as decimals (hvfleet grants the 29th vCPU) and
    28.999999999999996 as binary floats (Placement refuses it)."""
    assert float_boundary_diverges(100, 0.29)
    c = placement.client()
    rp = str(uuid.uuid4())
    c.request("POST", "/resource_providers", {"name": "boundary", "uuid": rp})
    c.request(
        "PUT",
        f"/resource_providers/{rp}/inventories",
        {
            "resource_provider_generation": 0,
            "inventories": {"VCPU": {"total": 100, "allocation_ratio": 0.29}},
        },
    )
    h = host("boundary", {"cpu": 100}, overcommit={"cpu": 0.29})
    check_claim(h, [], parse_request("29", None), NOW)  # hvfleet: fits

    def providers(amount: int) -> set[str]:
        out = c.get(f"/allocation_candidates?resources=VCPU:{amount}")
        return {u for ar in out["allocation_requests"] for u in ar["allocations"]}

    assert rp not in providers(29)  # Placement: does not
    assert rp in providers(28)
    claim = {"allocations": {rp: {"resources": {"VCPU": 29}}}, "project_id": "p", "user_id": "u"}
    c.microversion = "1.27"
    status, _ = c.request("PUT", f"/allocations/{uuid.uuid4()}", claim, expect=(409,))
    assert status == 409
