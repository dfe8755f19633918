"""Random fleets loaded side by side into hvfleet (Hypervisors, Reservations) and
a real Placement (resource providers, inventories, allocations), for the
differential test and the benchmark.

Placement is loaded into a fixed pool of providers that is reused from fleet to
fleet (re-PUT inventories, clear the previous fleet's allocations in one POST),
so a thousand cases cost seconds, not minutes.
"""

from __future__ import annotations

import random
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from fractions import Fraction
from typing import Any

from sched_fleet import host, reservation

from hvfleet.model import Hypervisor, Reservation, ResourceName
from hvfleet.model.capacity import exact_ratio
from hvfleet.scheduling.placement_client import PlacementClient

CLASSES = ["VCPU", "MEMORY_MB", "DISK_GB", "CUSTOM_NIC_VF"]
NAME = {"VCPU": "cpu", "MEMORY_MB": "memory", "DISK_GB": "disk", "CUSTOM_NIC_VF": "CUSTOM_NIC_VF"}
SUFFIX = {"VCPU": "", "MEMORY_MB": "Mi", "DISK_GB": "Gi", "CUSTOM_NIC_VF": ""}
RATIOS = [1.0, 1.0, 0.5, 0.75, 0.9, 0.95, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 0.1, 0.33]
PROJECT = "5d2f0c1e6a0b4ec5b1e0a2f3c4d5e6f7"
USER = "8a1b2c3d4e5f40718293a4b5c6d7e8f9"


def float_boundary_diverges(usable: int, ratio: float) -> bool:
    """True where Placement's float product falls below the exact product and the
    exact product is a whole number: `usable × ratio` written as decimals is
    N, but as binary floats N − ε, so Placement refuses the last unit hvfleet
    (exact decimal arithmetic) grants. E.g. 100 × 0.29 = 28.999999999999996."""
    exact = usable * exact_ratio(ratio)
    return exact.denominator == 1 and usable * ratio < exact


@dataclass
class Inventory:
    total: int
    reserved: int
    ratio: float
    min_unit: int = 1
    step: int = 1

    @property
    def max_unit(self) -> int:
        return max(1, self.total - self.reserved)

    def placement(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "reserved": self.reserved,
            "min_unit": self.min_unit,
            "max_unit": self.max_unit,
            "step_size": self.step,
            "allocation_ratio": self.ratio,
        }


@dataclass
class FleetHost:
    name: str
    inventories: dict[str, Inventory]
    # Usage in chunks (each a valid single allocation); where each chunk lives on
    # the hvfleet side: "allocation" (libvirt sees it) or "reservation".
    chunks: list[dict[str, int]] = field(default_factory=list)
    chunk_kind: list[str] = field(default_factory=list)
    ended: list[Reservation] = field(default_factory=list)


@dataclass
class Fleet:
    seed: int
    hosts: list[FleetHost]
    classes: list[str]
    avoided_boundaries: int = 0


def _ratio(rng: random.Random) -> float:
    if rng.random() < 0.6:
        return rng.choice(RATIOS)
    return float(f"{rng.uniform(0.05, 8.0):.2f}")


def random_fleet(seed: int, min_hosts: int = 5, max_hosts: int = 50) -> Fleet:
    rng = random.Random(seed)
    classes = ["VCPU", "MEMORY_MB"]
    if rng.random() < 0.5:
        classes.append("DISK_GB")
    if rng.random() < 0.3:
        classes.append("CUSTOM_NIC_VF")
    fleet = Fleet(seed, [], classes)
    for i in range(rng.randint(min_hosts, max_hosts)):
        invs: dict[str, Inventory] = {}
        for cls in classes:
            if rng.random() < 0.05:
                continue  # this host lacks the class
            total = {
                "VCPU": lambda: rng.randint(1, 128),
                "MEMORY_MB": lambda: rng.choice([rng.randint(1, 1 << 19), 1024 * rng.randint(1, 1024)]),
                "DISK_GB": lambda: rng.randint(1, 4000),
                "CUSTOM_NIC_VF": lambda: rng.randint(1, 64),
            }[cls]()
            roll = rng.random()
            reserved = 0 if roll < 0.4 else total if roll < 0.45 else rng.randint(0, total)
            ratio = _ratio(rng)
            while float_boundary_diverges(total - reserved, ratio):
                fleet.avoided_boundaries += 1
                ratio = _ratio(rng)
            inv = Inventory(total, reserved, ratio)
            if rng.random() < 0.1:
                inv.min_unit = rng.randint(1, 4)
            if rng.random() < 0.1:
                inv.step = rng.randint(1, 4)
            invs[cls] = inv
        h = FleetHost(f"h{i:02d}", invs)
        _usage(rng, h)
        fleet.hosts.append(h)
    return fleet


def _usage(rng: random.Random, h: FleetHost) -> None:
    """Fill part of each inventory with valid allocations (chunks)."""
    per_class: dict[str, list[int]] = {}
    for cls, inv in h.inventories.items():
        cap = (inv.total - inv.reserved) * exact_ratio(inv.ratio)
        roll = rng.random()
        target = 0 if roll < 0.2 else int(cap) if roll < 0.35 else rng.randint(0, int(cap))
        biggest = min(inv.total - inv.reserved, target)
        out, left = [], target
        while True:
            hi = min(biggest, left) // inv.step * inv.step
            lo = -(-inv.min_unit // inv.step) * inv.step
            if hi < lo or hi <= 0 or len(out) >= 8:
                break
            c = hi if rng.random() < 0.8 else rng.randrange(lo, hi + 1, inv.step)
            out.append(c)
            left -= c
        per_class[cls] = out
    n = max((len(v) for v in per_class.values()), default=0)
    for j in range(n):
        h.chunks.append({cls: v[j] for cls, v in per_class.items() if j < len(v)})
        h.chunk_kind.append("allocation" if rng.random() < 0.7 else "reservation")
    # Reservations that ended: hvfleet keeps them until gc, Placement never saw them.
    for k, phase in enumerate(["Released", "Expired", "Confirmed"]):
        if h.inventories and rng.random() < 0.3:
            cls = next(iter(h.inventories))
            h.ended.append(
                reservation(
                    f"ended-{h.name}-{k}",
                    h.name,
                    {NAME[cls]: f"{rng.randint(1, 8)}{SUFFIX[cls]}"},
                    consumer=f"vm-{h.name}-{k}",
                    phase="Released" if phase == "Released" else "Active",
                    expires_in=timedelta(seconds=-1) if phase == "Expired" else None,
                )
            )


def hv_quantity(cls: str, units: int) -> str:
    return f"{units}{SUFFIX[cls]}"


def to_hvfleet(fleet: Fleet) -> tuple[list[Hypervisor], list[Reservation]]:
    hosts, reservations = [], []
    for fh in fleet.hosts:
        allocation: dict[str, int] = {}
        for chunk, kind in zip(fh.chunks, fh.chunk_kind, strict=True):
            if kind == "allocation":
                for cls, units in chunk.items():
                    allocation[cls] = allocation.get(cls, 0) + units
            else:
                reservations.append(
                    reservation(
                        f"r-{fh.name}-{len(reservations)}",
                        fh.name,
                        {NAME[c]: hv_quantity(c, u) for c, u in chunk.items()},
                        consumer=f"usage-{fh.name}-{len(reservations)}",
                        expires_in=timedelta(hours=1),
                    )
                )
        annotations = {}
        for cls, inv in fh.inventories.items():
            if inv.min_unit != 1:
                annotations[f"scheduling.hvfleet.io/min-unit.{NAME[cls]}"] = hv_quantity(cls, inv.min_unit)
            if inv.step != 1:
                annotations[f"scheduling.hvfleet.io/step-size.{NAME[cls]}"] = hv_quantity(cls, inv.step)
        confirmed = [r.spec.consumer for r in fh.ended if r.name.endswith("-2")]
        hosts.append(
            host(
                fh.name,
                {NAME[c]: hv_quantity(c, i.total) for c, i in fh.inventories.items()},
                reserved={NAME[c]: hv_quantity(c, i.reserved) for c, i in fh.inventories.items()},
                overcommit={NAME[c]: i.ratio for c, i in fh.inventories.items()},
                allocation={NAME[c]: hv_quantity(c, u) for c, u in allocation.items()},
                annotations=annotations,
                instances=confirmed,
            )
        )
        reservations.extend(fh.ended)
    return hosts, reservations


def units_free(h: Hypervisor, free: dict[ResourceName, Fraction], cls: str) -> int:
    r = ResourceName.parse(NAME[cls])
    return int(free.get(r, Fraction(0)) // r.placement.base_per_unit)


class PlacementPool:
    """A fixed set of providers in a real Placement, reloaded for each fleet."""

    def __init__(self, client: PlacementClient, size: int = 50, prefix: str = "pool") -> None:
        self.c = client
        self.uuids = [str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{prefix}-{i}")) for i in range(size)]
        self.names = {u: f"{prefix}-{i:05d}" for i, u in enumerate(self.uuids)}
        self.row = {u: i for i, u in enumerate(self.uuids)}
        self.loaded: set[int] = set()
        self.consumers: list[str] = []
        self.c.request("PUT", "/resource_classes/CUSTOM_NIC_VF", expect=(201, 204))
        for u in self.uuids:
            self.c.request("POST", "/resource_providers", {"name": self.names[u], "uuid": u})

    def _post_allocations(self, body: dict[str, Any]) -> None:
        if not body:
            return
        mv = self.c.microversion
        self.c.microversion = "1.27"  # no consumer generations: the pool owns every consumer
        try:
            self.c.request("POST", "/allocations", body)
        finally:
            self.c.microversion = mv

    def load(self, fleet: Fleet) -> None:
        self._post_allocations(
            {c: {"allocations": {}, "project_id": PROJECT, "user_id": USER} for c in self.consumers}
        )
        self.consumers = []
        gens = {
            rp["uuid"]: rp["generation"] for rp in self.c.get("/resource_providers")["resource_providers"]
        }
        wanted = set(range(len(fleet.hosts)))
        for i in sorted(wanted | self.loaded):
            u = self.uuids[i]
            invs = (
                {c: inv.placement() for c, inv in fleet.hosts[i].inventories.items()} if i in wanted else {}
            )
            self.c.request(
                "PUT",
                f"/resource_providers/{u}/inventories",
                {"resource_provider_generation": gens[u], "inventories": invs},
            )
        self.loaded = wanted
        body: dict[str, Any] = {}
        depth = max((len(h.chunks) for h in fleet.hosts), default=0)
        for j in range(depth):
            allocs = {
                self.uuids[i]: {"resources": h.chunks[j]}
                for i, h in enumerate(fleet.hosts)
                if j < len(h.chunks) and h.chunks[j]
            }
            if allocs:
                consumer = str(uuid.UUID(int=random.Random(f"{fleet.seed}-{j}").getrandbits(128)))
                body[consumer] = {"allocations": allocs, "project_id": PROJECT, "user_id": USER}
                self.consumers.append(consumer)
        self._post_allocations(body)

    def candidates(self, resources: dict[str, int]) -> set[int]:
        q = ",".join(f"{c}:{a}" for c, a in sorted(resources.items()))
        out = self.c.get("/allocation_candidates?" + urllib.parse.urlencode({"resources": q}))
        found: set[int] = set()
        for ar in out["allocation_requests"]:
            found.update(self.row[u] for u in ar["allocations"])
        return found

    def claim(self, row: int, resources: dict[str, int], consumer: str) -> bool:
        mv = self.c.microversion
        self.c.microversion = "1.27"
        try:
            status, _ = self.c.request(
                "PUT",
                f"/allocations/{consumer}",
                {
                    "allocations": {self.uuids[row]: {"resources": resources}},
                    "project_id": PROJECT,
                    "user_id": USER,
                },
                expect=(400, 409),
            )
        finally:
            self.c.microversion = mv
        if status == 204:
            self.consumers.append(consumer)
        return status == 204
