"""One truth for "where does this fit": over the same store, the hosts
`fit` returns (the fleet index) are exactly the hypervisor providers in
hvfleet's served `GET /allocation_candidates` as Nova's scheduler asks it
(`root_required=!COMPUTE_STATUS_DISABLED`: a host in maintenance or not
Ready carries that trait, and so does one whose agent's Lease lapsed or,
without a Lease, whose heartbeat is older than the staleness). Hypothesis
draws hosts (Ready, drained, NotReady; a live, lapsed, released or no Lease;
a fresh, stale or no heartbeat) with capacities, libvirt allocations, reserves and overcommit ratios, and
claims in every phase (Active, Confirmed with its instance running, expired),
then asks both for cpu and memory amounts, many at a host's last free unit."""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hvfleet.model.hypervisor import Reservation, ReservationSpec, ReservationStatus
from hvfleet.model.lease import Lease, LeaseSpec
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.quantity import Quantity
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.model.resources import ResourceName
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import parse_request
from hvfleet.store.ownership import agent_manager
from tests.placement.support import Placement, _served_sqlite
from tests.scheduling.sched_fleet import host, put_host

GI = 1024  # MiB
NOVA = "root_required=!COMPUTE_STATUS_DISABLED"
_fleets = itertools.count()


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    yield from _served_sqlite(seeded=False)


@st.composite
def hosts(draw: st.DrawFn) -> dict[str, Any]:
    cpu, memory = draw(st.integers(1, 24)), draw(st.integers(1, 32))
    return {
        "cpu": cpu, "memory": memory,
        "allocation": (draw(st.integers(0, cpu)), draw(st.integers(0, memory))),
        "reserved": (draw(st.integers(0, min(cpu - 1, 2))), draw(st.sampled_from([0, 0, 1]))),
        "ratios": (draw(st.sampled_from([1.0, 1.5, 2.0, 4.0, 0.5])), draw(st.sampled_from([1.0, 1.5]))),
        "state": draw(st.sampled_from(["Ready", "Ready", "Ready", "drain", "NotReady"])),
        "lease": draw(st.sampled_from(["none", "none", "live", "lapsed", "released"])),
        "beat": draw(st.sampled_from(["fresh", "fresh", "stale", "none"])),
        "claims": draw(st.lists(st.tuples(st.sampled_from(["Active", "running", "expired"]),
                                          st.integers(1, 4), st.integers(0, 4)), max_size=3)),
    }


def _lease(name: str, state: str) -> Lease | None:
    """The agent's Lease of host `name`: renewed just now (live), two minutes
    ago for 30 s (lapsed), or let go (released)."""
    if state == "none":
        return None
    now = datetime.now(UTC)
    renew = now - timedelta(minutes=2) if state == "lapsed" else now
    holder = "" if state == "released" else agent_manager(name)
    return Lease(metadata=ObjectMeta(name=name), spec=LeaseSpec(
        holder_identity=holder, lease_duration_seconds=30, acquire_time=renew, renew_time=renew))


_BEATS = {"fresh": timedelta(0), "stale": DEFAULT_STALENESS + timedelta(minutes=1)}


def _claim(name: str, hv: str, phase: str, cpu: int, memory: int) -> tuple[Reservation, str | None]:
    consumer = str(uuid.uuid4())
    now = datetime.now(UTC)
    expires = now - timedelta(minutes=5) if phase == "expired" else now + timedelta(hours=1)
    amounts = {ResourceName.parse("cpu"): Quantity(cpu)}
    if memory:
        amounts[ResourceName.parse("memory")] = Quantity.parse(f"{memory}Gi")
    spec = ReservationSpec(hypervisor=hv, resources=amounts, consumer=consumer, expires_at=expires)
    r = Reservation(metadata=ObjectMeta(name=name), spec=spec, status=ReservationStatus(phase="Active"))
    return r, consumer if phase == "running" else None


@settings(max_examples=15, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fleet=st.lists(hosts(), min_size=1, max_size=5),
       asks=st.lists(st.tuples(st.integers(1, 12), st.sampled_from([0, 512, GI, 2 * GI, 4 * GI, 8 * GI])),
                     min_size=2, max_size=4))
def test_fit_and_served_allocation_candidates_name_the_same_hosts(
        api: Placement, fleet: list[dict[str, Any]], asks: list[tuple[int, int]]) -> None:
    prefix = f"f{next(_fleets)}-"
    names: dict[str, str] = {}
    for i, h in enumerate(fleet):
        name = f"{prefix}{i}"
        running: list[str] = []
        claims = [_claim(f"{name}-c{j}", name, *c) for j, c in enumerate(h["claims"])]
        running = [consumer for _, consumer in claims if consumer is not None]
        made = host(name, {"cpu": h["cpu"], "memory": f"{h['memory']}Gi"},
                    allocation={"cpu": h["allocation"][0], "memory": f"{h['allocation'][1]}Gi"},
                    reserved={"cpu": h["reserved"][0], "memory": f"{h['reserved'][1]}Gi"},
                    overcommit={"cpu": h["ratios"][0], "memory": h["ratios"][1]},
                    beat=None if h["beat"] == "none" else datetime.now(UTC) - _BEATS[h["beat"]],
                    instances=running,
                    maintenance="drain" if h["state"] == "drain" else "",
                    ready="False" if h["state"] == "NotReady" else "True")
        names[put_host(api.store, made).metadata.uid] = name
        lease = _lease(name, h["lease"])
        if lease is not None:
            api.store.create(lease, agent_manager(name))
        for r, _ in claims:
            api.store.create(r, "test")
    index = FleetIndex()
    index.load_from(api.store)
    # And at each host's last free cpu and memory unit (as fit counts them), and one past it.
    cpu_of, memory_of = ResourceName.parse("cpu"), ResourceName.parse("memory")
    for name in names.values():
        free = index.free(name)
        cpu, memory = math.floor(free[cpu_of]), math.floor(free[memory_of]) // 2**20
        asks += [(c, m) for c in (cpu, cpu + 1) for m in (0, memory, memory + 1) if c > 0 and m >= 0]
    wrong = []
    for cpu, memory in asks:
        fit = index.fit(parse_request(str(cpu), f"{memory}Mi" if memory else None))
        fits = sorted(n for n in fit.names if n.startswith(prefix))
        query = f"VCPU:{cpu}" + (f",MEMORY_MB:{memory}" if memory else "")
        # What Nova's scheduler asks: never a root whose compute is disabled (its compute_status_filter).
        r = api.call("GET", f"/allocation_candidates?resources={query}&{NOVA}")
        assert r.status_code == 200, r.text
        served = sorted(names[u] for u in r.json()["provider_summaries"] if u in names)
        if fits != served:
            wrong.append(f"{query}: fit {fits}, allocation_candidates {served}")
    assert not wrong, "\n".join(wrong)

