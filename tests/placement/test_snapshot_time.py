"""The provider snapshot judges time as a whole read does: hypothesis draws
hosts with heartbeats of any age, agents' Leases (none, live, lapsing, let
go) and reservations expiring at any time, and Lease renewals written along
the way; at each of a run of later times the snapshot, caught up with the
store and asked at that time, holds the same providers (usages, traits with
COMPUTE_STATUS_DISABLED) as `read_fleet` at that time, which judges each host
afresh with `host_readiness` and `holds_space`."""

from __future__ import annotations

import itertools
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model.hypervisor import Reservation
from hvfleet.model.lease import Lease, LeaseSpec, renewed
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.placement.records import read_fleet
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from tests.scheduling.sched_fleet import host, put_host

STALE_S = int(DEFAULT_STALENESS.total_seconds())
_runs = itertools.count()


@st.composite
def hosts(draw: st.DrawFn) -> dict[str, Any]:
    return {
        # Seconds before the start: the heartbeat goes stale STALE_S after it.
        "beat": draw(st.one_of(st.none(), st.integers(0, STALE_S + 30))),
        "lease": draw(st.one_of(st.none(), st.tuples(st.integers(-60, 0), st.integers(1, 60),
                                                      st.booleans()))),
        "claims": draw(st.lists(st.integers(-10, 300), max_size=2)),
    }


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(fleet=st.lists(hosts(), min_size=1, max_size=4),
       steps=st.lists(st.tuples(st.integers(0, 120), st.one_of(st.none(), st.integers(0, 3))),
                      min_size=1, max_size=6))
def test_the_snapshot_judges_time_as_a_whole_read_at_every_moment(
        fleet: list[dict[str, Any]], steps: list[tuple[int, int | None]]) -> None:
    d = Path(tempfile.mkdtemp())
    store = open_store(f"sqlite:///{d}/hvfleet-{next(_runs)}.db")
    start = datetime.now(UTC)
    at = lambda s: start + timedelta(seconds=s)  # noqa: E731
    names = []
    for i, h in enumerate(fleet):
        name = f"hv{i}"
        names.append(name)
        beat = None if h["beat"] is None else at(-h["beat"])
        put_host(store, host(name, {"cpu": 8, "memory": "8Gi"}, beat=beat))
        if h["lease"] is not None:
            renew, duration, held = h["lease"]
            store.create(Lease(metadata=ObjectMeta(name=name), spec=LeaseSpec(
                holder_identity=agent_manager(name) if held else "", lease_duration_seconds=duration,
                acquire_time=at(renew), renew_time=at(renew))), agent_manager(name))
        for j, expires in enumerate(h["claims"]):
            store.create(Reservation.model_validate({"metadata": {"name": f"{name}-r{j}"}, "spec": {
                "hypervisor": name, "resources": {"cpu": 1 + j}, "consumer": f"c-{name}-{j}",
                "expires_at": at(expires).isoformat()}}), "test")
    snap = ProviderSnapshot.from_store(store)
    try:
        assert dict(snap.fleet(start).providers) == dict(read_fleet(store, start).providers)
        t = 0
        for dt, renew in steps:
            t += dt
            if renew is not None and renew < len(names):  # an agent renews its Lease at t
                name = names[renew]
                current = store.agent_leases().get(name)
                new = renewed(current, name, agent_manager(name), 30, at(t))
                if current is None:
                    store.create(new, agent_manager(name))
                else:
                    store.update(new, agent_manager(name))
                snap.refresh(store)
            # Nothing written: the snapshot's answer at t is a whole read's at t.
            whole = read_fleet(store, at(t))
            assert dict(snap.fleet(at(t)).providers) == dict(whole.providers), t
            assert snap.graph(at(t)).providers == whole.graph().providers, t
    finally:
        store.close()
