"""Resources libvirt cannot see, against a real OpenStack Placement.

Random fleets whose hosts have VCPU and MEMORY_MB (what the agent discovers:
`status.capacity`, counted in `status.allocation`) and VGPU and CUSTOM_NIC_VF
(only in `spec.extraCapacity`: libvirt never shows them), with instances in
every state:
- running with a claim (its reservation derived or recorded Confirmed): libvirt
  counts its cpu and memory, the claim must keep holding its VGPU and VFs;
- running without a claim (cpu and memory only), pending (claimed, not yet
  shown), gone (recorded Confirmed, the instance deleted), released, expired.
Placement holds an allocation for every running and pending instance, as nova
leaves it. For every case:
- the hosts `FleetIndex.fit` returns == Placement's GET /allocation_candidates;
- a claim succeeds in hvfleet exactly when Placement accepts PUT /allocations;
  accepted claims stay, and half of them then show up in libvirt;
- at the end of each fleet, `placement export`'s usages == Placement's usages.
HVFLEET_INVISIBLE_FLEETS × HVFLEET_INVISIBLE_REQUESTS cases (12 × 25 = 300).
"""

from __future__ import annotations

import os
import random
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from fractions import Fraction
from typing import Any

import pytest
from placement_fleets import float_boundary_diverges
from real_placement import RealPlacement
from sched_fleet import NOW, host, reservation

from hvfleet.model import Hypervisor, Quantity, Reservation, ResourceName
from hvfleet.model.hypervisor import Instance
from hvfleet.scheduling.errors import DoesNotFit
from hvfleet.scheduling.fit import check_claim
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.placement import export_provider, placement_resources
from hvfleet.scheduling.placement_client import PlacementClient
from hvfleet.scheduling.request import parse_request
from hvfleet.store.base import WatchEvent

FLEETS = int(os.environ.get("HVFLEET_INVISIBLE_FLEETS", "12"))
REQUESTS = int(os.environ.get("HVFLEET_INVISIBLE_REQUESTS", "25"))
BASE_SEED = 20261201

SEEN = ("VCPU", "MEMORY_MB")  # in status.capacity: libvirt shows them
UNSEEN = ("VGPU", "CUSTOM_NIC_VF")  # only in spec.extraCapacity
NAME = {"VCPU": "cpu", "MEMORY_MB": "memory", "VGPU": "VGPU", "CUSTOM_NIC_VF": "CUSTOM_NIC_VF"}
SUFFIX = {"VCPU": "", "MEMORY_MB": "Mi", "VGPU": "", "CUSTOM_NIC_VF": ""}
RATIOS = [1.0, 1.0, 1.0, 0.5, 1.5, 2.0, 4.0, 0.75]
STATES = ["running", "running", "running-unclaimed", "pending", "gone", "released", "expired"]


def hq(cls: str, units: int) -> str:
    return f"{units}{SUFFIX[cls]}"


@dataclass
class Inventory:
    total: int
    reserved: int
    ratio: float

    def placement(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "reserved": self.reserved,
            "max_unit": max(1, self.total - self.reserved),
            "allocation_ratio": self.ratio,
        }


@dataclass
class Side:
    """One fleet on both sides: hvfleet's hosts and reservations, Placement's providers."""

    hosts: dict[str, Hypervisor] = field(default_factory=dict)
    reservations: list[Reservation] = field(default_factory=list)
    provider: dict[str, str] = field(default_factory=dict)  # host → provider uuid
    inventories: dict[str, dict[str, Inventory]] = field(default_factory=dict)


def _ratio(rng: random.Random, usable: int) -> float:
    ratio = rng.choice(RATIOS) if rng.random() < 0.7 else float(f"{rng.uniform(0.3, 4.0):.2f}")
    while float_boundary_diverges(usable, ratio):
        ratio = rng.choice(RATIOS)
    return ratio


def _allocate(c: PlacementClient, consumer: str, provider: str, resources: dict[str, int]) -> bool:
    status, _ = c.request(
        "PUT",
        f"/allocations/{consumer}",
        {"allocations": {provider: {"resources": resources}}, "project_id": "p", "user_id": "u"},
        expect=(400, 409),
    )
    return status == 204


def _instance_resources(rng: random.Random, invs: dict[str, Inventory], claimed: bool) -> dict[str, int]:
    out = {
        "VCPU": rng.randint(1, 8),
        "MEMORY_MB": rng.choice([512, 1024, 2048, 4096, rng.randint(1, 8192)]),
    }
    if claimed:
        for cls in UNSEEN:
            if cls in invs and rng.random() < 0.6:
                out[cls] = rng.randint(1, 3)
    return {k: v for k, v in out.items() if k in invs}


def build_fleet(seed: int, c: PlacementClient) -> Side:
    rng = random.Random(seed)
    side = Side()
    for i in range(rng.randint(4, 14)):
        name = f"s{seed % 1000}-h{i:02d}"
        invs: dict[str, Inventory] = {}
        for cls, lo, hi in (("VCPU", 4, 64), ("MEMORY_MB", 4096, 131072), ("VGPU", 1, 16),
                            ("CUSTOM_NIC_VF", 1, 32)):
            if cls in UNSEEN and rng.random() < 0.3:
                continue
            total = rng.randint(lo, hi)
            reserved = 0 if rng.random() < 0.6 else rng.randint(0, total // 4)
            invs[cls] = Inventory(total, reserved, _ratio(rng, total - reserved))
        u = str(uuid.uuid4())
        c.request("POST", "/resource_providers", {"name": name, "uuid": u})
        c.request("PUT", f"/resource_providers/{u}/inventories",
                  {"resource_provider_generation": 0,
                   "inventories": {k: v.placement() for k, v in invs.items()}})
        side.provider[name] = u
        side.inventories[name] = invs
        running: list[str] = []
        allocation = {"VCPU": 0, "MEMORY_MB": 0}
        for j in range(rng.randint(0, 8)):
            state = rng.choice(STATES)
            consumer = str(uuid.UUID(int=rng.getrandbits(128)))
            resources = _instance_resources(rng, invs, claimed=state != "running-unclaimed")
            if not resources:
                continue
            allocated = state in ("running", "running-unclaimed", "pending")
            if allocated and not _allocate(c, consumer, u, resources):
                continue  # Placement has no room for it: it does not exist on either side
            if state.startswith("running"):
                running.append(consumer)
                for cls in SEEN:
                    allocation[cls] += resources.get(cls, 0)
            if state == "running-unclaimed":
                continue
            phase = {"running": rng.choice(["Active", "Confirmed"]), "pending": "Active",
                     "gone": "Confirmed", "released": "Released", "expired": "Active"}[state]
            side.reservations.append(reservation(
                f"r-{name}-{j}", name, {NAME[k]: hq(k, v) for k, v in resources.items()},
                consumer=consumer, phase=phase,
                expires_in=timedelta(seconds=-1) if state == "expired" else rng.choice(
                    [None, timedelta(hours=1)]),
                source=rng.choice(["hvfleet", "placement"]),
            ))
        side.hosts[name] = host(
            name,
            {NAME[k]: hq(k, v.total) for k, v in invs.items() if k in SEEN},
            extra={NAME[k]: hq(k, v.total) for k, v in invs.items() if k in UNSEEN},
            reserved={NAME[k]: hq(k, v.reserved) for k, v in invs.items()},
            overcommit={NAME[k]: v.ratio for k, v in invs.items()},
            allocation={NAME[k]: hq(k, v) for k, v in allocation.items() if k in invs},
            instances=running,
        )
    return side


def random_request(rng: random.Random, side: Side, index: FleetIndex) -> dict[str, int]:
    classes = ["VCPU"] if rng.random() < 0.8 else []
    classes += [c for c in ("MEMORY_MB", *UNSEEN) if rng.random() < 0.5]
    classes = classes or [rng.choice(UNSEEN)]
    out: dict[str, int] = {}
    for cls in classes:
        if rng.random() < 0.5:
            name = rng.choice(sorted(side.hosts))
            r = ResourceName(NAME[cls])
            free = int(index.free(name).get(r, Fraction(0)) // r.placement.base_per_unit)
            out[cls] = max(1, free + rng.choice([-1, 0, 0, 1]))
        else:
            out[cls] = {"VCPU": rng.randint(1, 16), "MEMORY_MB": rng.randint(1, 16384),
                        "VGPU": rng.randint(1, 4), "CUSTOM_NIC_VF": rng.randint(1, 6)}[cls]
    return out


def _show_up(index: FleetIndex, h: Hypervisor, consumer: str, resources: dict[str, int]) -> Hypervisor:
    """libvirt now shows the claimed instance: its cpu and memory join the allocation."""
    alloc = dict(h.status.allocation)
    for cls in SEEN:
        if cls in resources:
            r = ResourceName(NAME[cls])
            alloc[r] = alloc[r] + Quantity.parse(hq(cls, resources[cls]))
    status = h.status.model_copy(update={
        "allocation": alloc,
        "instances": [*h.status.instances, Instance(uuid=consumer, name=consumer[:8], state="running")],
    })
    rv = index.revision + 1
    meta = h.metadata.model_copy(update={"resource_version": str(rv)})
    shown = h.model_copy(update={"status": status, "metadata": meta})
    index.apply(WatchEvent("MODIFIED", shown, rv), now=NOW)
    return shown


@dataclass
class Tally:
    cases: int = 0
    fits: int = 0
    claims_ok: int = 0
    shown_with_unseen: int = 0
    mismatches: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def placement() -> Iterator[RealPlacement]:
    with RealPlacement() as p:
        yield p


def as_request(resources: dict[str, int]) -> Any:
    cpu = resources.get("VCPU")
    mem = resources.get("MEMORY_MB")
    other = [f"{c}={a}" for c, a in resources.items() if c in UNSEEN]
    return parse_request(None if cpu is None else str(cpu), None if mem is None else f"{mem}Mi", other)


def test_resources_libvirt_cannot_see_count_as_in_real_placement(placement: RealPlacement) -> None:
    c = placement.client("1.27")
    c.request("PUT", "/resource_classes/CUSTOM_NIC_VF", expect=(201, 204))
    tally = Tally()
    for seed in range(BASE_SEED, BASE_SEED + FLEETS):
        side = build_fleet(seed, c)
        mine_uuid = {u: n for n, u in side.provider.items()}
        index = FleetIndex()
        index.load(side.hosts.values(), side.reservations, now=NOW)
        rng = random.Random(seed * 31)
        for case in range(REQUESTS):
            tally.cases += 1
            resources = random_request(rng, side, index)
            request = as_request(resources)
            assert placement_resources(request) == resources
            mine = set(index.fit(request, now=NOW).names)
            q = ",".join(f"{k}:{v}" for k, v in sorted(resources.items()))
            out = c.get("/allocation_candidates?" + urllib.parse.urlencode({"resources": q}))
            theirs = {mine_uuid[u] for ar in out["allocation_requests"] for u in ar["allocations"]
                      if u in mine_uuid}
            tally.fits += len(mine)
            if mine != theirs:
                tally.mismatches.append(f"seed={seed} case={case} fit {resources}: only hvfleet "
                                        f"{sorted(mine - theirs)}, only placement {sorted(theirs - mine)}")
            name = rng.choice(sorted(mine)) if mine and rng.random() < 0.6 else rng.choice(sorted(side.hosts))
            h = index.host(name)
            assert h is not None
            consumer = str(uuid.UUID(int=rng.getrandbits(128)))
            try:
                check_claim(h, index.reservations_of(name), request, NOW)
                ours = True
            except DoesNotFit:
                ours = False
            theirs_ok = _allocate(c, consumer, side.provider[name], resources)
            if ours != theirs_ok:
                tally.mismatches.append(f"seed={seed} case={case} claim {resources} on {name}: hvfleet "
                                        f"{'accepts' if ours else 'refuses'}, placement "
                                        f"{'accepts' if theirs_ok else 'refuses'}")
            if ours and theirs_ok:
                tally.claims_ok += 1
                r = reservation(f"claim-{seed}-{case}", name,
                                {NAME[k]: hq(k, v) for k, v in resources.items()},
                                consumer=consumer, expires_in=timedelta(hours=1))
                index.apply(WatchEvent("ADDED", r, index.revision + 1), now=NOW)
                if rng.random() < 0.5:
                    _show_up(index, h, consumer, resources)
                    tally.shown_with_unseen += any(k in UNSEEN for k in resources)
        for name, u in side.provider.items():
            h = index.host(name)
            assert h is not None
            ours_usages = export_provider(h, index.reservations_of(name), NOW)["usages"]
            theirs_usages = {k: v for k, v in c.get(f"/resource_providers/{u}/usages")["usages"].items() if v}
            if ours_usages != theirs_usages:
                tally.mismatches.append(f"seed={seed} usages of {name}: hvfleet {ours_usages}, "
                                        f"placement {theirs_usages}")
    print(f"\ninvisible-resources differential: {tally.cases} cases, {tally.fits} host fits, "
          f"{tally.claims_ok} claims accepted by both, {tally.shown_with_unseen} of them shown "
          f"in libvirt with VGPU/VFs, {len(tally.mismatches)} mismatches")
    assert not tally.mismatches, "\n".join(tally.mismatches[:30])
    assert tally.shown_with_unseen > 0  # the case the bug was about did occur
