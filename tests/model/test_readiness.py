"""Readiness: one table of what every reader shows, and proof that the readers
(fit, the fleet index, the hypervisor table, the capacity summary) agree."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet import views
from hvfleet.model import Condition, Hypervisor
from hvfleet.model.lease import Lease, LeaseSpec
from hvfleet.model.meta import ObjectMeta
from hvfleet.model.readiness import (
    DEFAULT_STALENESS,
    Readiness,
    fresh_until,
    host_readiness,
    readiness,
    readiness_turn,
)
from hvfleet.scheduling.fit import candidacy
from hvfleet.scheduling.index import FleetIndex
from hvfleet.scheduling.request import parse_request

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
FRESH = NOW - timedelta(seconds=5)
EDGE = NOW - DEFAULT_STALENESS  # exactly as old as allowed: still fresh
OLD = NOW - DEFAULT_STALENESS - timedelta(seconds=1)
TWO_HOURS = NOW - timedelta(hours=2)


def hv(
    cond: str | None = "True",
    beat: datetime | None = FRESH,
    maintenance: str = "",
    reason: str = "Reconciled",
) -> Hypervisor:
    status: dict[str, Any] = {"capacity": {"cpu": 8}, "lastHeartbeatTime": beat}
    if cond is not None:
        status["conditions"] = [Condition(type="Ready", status=cond, reason=reason).to_dict()]  # type: ignore[arg-type]
    spec: dict[str, Any] = {"maintenance": maintenance}
    if maintenance == "manual":
        spec["maintenanceReason"] = "disk swap"
    return Hypervisor.model_validate({"metadata": {"name": "hv"}, "spec": spec, "status": status})


# (lease_live, Ready condition, heartbeat, maintenance) → (state, reason)
TABLE = [
    # Healthy.
    (None, "True", FRESH, "", "Ready", "Reconciled"),
    (True, "True", FRESH, "", "Ready", "Reconciled"),
    (None, "True", EDGE, "", "Ready", "Reconciled"),
    # The bug: Ready=True with a 2-hour-old heartbeat is Stale, not Ready.
    (None, "True", TWO_HOURS, "", "Stale", "HeartbeatStale"),
    (None, "True", OLD, "", "Stale", "HeartbeatStale"),
    (None, "True", None, "", "Stale", "NoHeartbeat"),
    # A live lease is the agent's heartbeat (status is rewritten only on change).
    (True, "True", TWO_HOURS, "", "Ready", "Reconciled"),
    (True, "True", None, "", "Ready", "Reconciled"),
    (True, "False", FRESH, "", "NotReady", "Reconciled"),
    # An expired lease wins over everything the stored status says.
    (False, "True", FRESH, "", "NotReady", "AgentLeaseExpired"),
    (False, "True", TWO_HOURS, "", "NotReady", "AgentLeaseExpired"),
    (False, None, None, "", "NotReady", "AgentLeaseExpired"),
    # The Ready condition.
    (None, "False", FRESH, "", "NotReady", "Reconciled"),
    (None, "False", TWO_HOURS, "", "NotReady", "Reconciled"),
    (None, "Unknown", FRESH, "", "Unknown", "Reconciled"),
    (None, None, FRESH, "", "Unknown", "NoReadyCondition"),
    (None, None, None, "", "Unknown", "NoReadyCondition"),
    # Maintenance shows on a healthy host, and on one whose agent went quiet
    # (stale, below); a host whose agent reports it sick shows what is wrong.
    (None, "True", FRESH, "drain", "Maintenance", "Maintenance"),
    (True, "True", FRESH, "manual", "Maintenance", "Maintenance"),
    (None, "True", TWO_HOURS, "drain", "Maintenance", "Maintenance"),
    (None, "True", None, "manual", "Maintenance", "Maintenance"),
    (False, "True", TWO_HOURS, "drain", "Maintenance", "Maintenance"),
    (None, "False", FRESH, "manual", "NotReady", "Reconciled"),
    (True, "Unknown", FRESH, "manual", "Unknown", "Reconciled"),
]


@pytest.mark.parametrize(("live", "cond", "beat", "maintenance", "state", "reason"), TABLE)
def test_readiness_table(
    live: bool | None, cond: str | None, beat: datetime | None, maintenance: str, state: str, reason: str
) -> None:
    got = readiness(hv(cond, beat, maintenance), NOW, live)
    assert (got.state, got.reason) == (state, reason)
    assert got.ready is (state == "Ready")
    assert got.message


def test_a_host_in_maintenance_whose_agent_went_quiet_shows_maintenance_with_its_staleness() -> None:
    aged = readiness(hv(beat=TWO_HOURS, maintenance="manual"), NOW)
    assert (aged.state, aged.stale, aged.shown) == ("Maintenance", True, "Maintenance,Stale")
    assert aged.message == "in maintenance (manual) (disk swap); last heartbeat 7200s ago, older than 180s"
    assert aged.to_dict()["stale"] is True
    expired = readiness(hv(beat=FRESH, maintenance="drain"), NOW, lease_live=False)
    assert expired.shown == "Maintenance,Stale" and "lease expired" in expired.message
    fresh = readiness(hv(beat=FRESH, maintenance="manual"), NOW)
    assert (fresh.shown, fresh.stale) == ("Maintenance", False) and "stale" not in fresh.to_dict()
    assert views.hypervisor_row(hv(beat=TWO_HOURS, maintenance="manual"), NOW)[1] == "Maintenance,Stale"


def test_reasons_and_messages_say_what_to_look_at() -> None:
    stale = readiness(hv(beat=TWO_HOURS), NOW)
    assert stale.message == "last heartbeat 7200s ago, older than 180s"
    assert "disk swap" in readiness(hv(maintenance="manual"), NOW).message
    unparsable = readiness(hv("False", reason=""), NOW)
    assert unparsable.reason == "ReadyFalse"
    assert readiness(hv(beat=OLD), NOW, staleness=timedelta(hours=1)).state == "Ready"


LIVES = (None, True, False)
CONDS = (None, "True", "False", "Unknown")
BEATS = (None, FRESH, EDGE, OLD, TWO_HOURS)
MAINTENANCES = ("", "drain")
COMBOS = list(itertools.product(LIVES, CONDS, BEATS, MAINTENANCES))


def test_ready_exactly_when_every_input_allows_it() -> None:
    for live, cond, beat, maint in COMBOS:
        fresh = live is True or (beat is not None and beat >= EDGE)
        expected = live is not False and cond == "True" and fresh and not maint
        assert readiness(hv(cond, beat, maint), NOW, live).ready is expected, (live, cond, beat, maint)


def test_every_reader_agrees_with_readiness() -> None:
    """fit's candidacy, the vectorised index, the `get` table and the capacity
    summary, over every combination of inputs."""
    request = parse_request("1", None)
    for live, cond, beat, maint in COMBOS:
        h = hv(cond, beat, maint)
        r = readiness(h, NOW, live)
        where = (live, cond, beat, maint)
        assert (candidacy(h, NOW, live=live) is None) is r.ready, where
        index = FleetIndex()
        index.load([h], [], now=NOW)
        if live is not None:
            index.set_liveness({"hv": live})
        assert (index.fit(request, now=NOW).names == ["hv"]) is r.ready, where
        assert views.hypervisor_row(h, NOW, live)[1] == r.shown, where
        summary = views.fleet_summary([h], [], {} if live is None else {"hv": live}, NOW)
        assert summary.hosts[0].readiness == r, where
        if r.state == "Stale" and beat is not None:
            # The index compares fresh_until; readiness compares the age: same instant.
            until = fresh_until(h)
            assert until is not None and until < NOW


def _judged(r: Readiness) -> tuple[str, bool, str]:
    return r.state, r.ready, r.reason  # the message says a heartbeat's age: it moves on


@settings(max_examples=300, deadline=None)
@given(cond=st.sampled_from(["True", "False", "Unknown", None]),
       beat=st.one_of(st.none(), st.integers(-400, 10)),  # seconds from NOW
       beat_us=st.integers(0, 999_999),
       maintenance=st.sampled_from(["", "", "drain"]),
       lease=st.one_of(st.none(), st.tuples(st.integers(-120, 0), st.integers(1, 120), st.booleans())),
       later=st.lists(st.integers(0, 600), min_size=1, max_size=8),
       later_us=st.sampled_from([0, 1, 999_999]))
def test_readiness_turn_is_the_first_moment_host_readiness_may_change(
        cond: str | None, beat: int | None, beat_us: int, maintenance: str,
        lease: tuple[int, int, bool] | None, later: list[int], later_us: int) -> None:
    """Before `readiness_turn` (or ever, when there is none) `host_readiness`
    judges the host as at NOW with nothing written; the turn is after NOW;
    and at the turn a Ready host is no longer Ready (a turn is never late)."""
    h = hv(cond, None if beat is None else NOW + timedelta(seconds=beat, microseconds=beat_us), maintenance)
    held: Lease | None = None
    if lease is not None:
        renew, duration, holds = lease
        at = NOW + timedelta(seconds=renew)
        held = Lease(metadata=ObjectMeta(name="hv"), spec=LeaseSpec(
            holder_identity="agent/hv" if holds else "", lease_duration_seconds=duration,
            acquire_time=at, renew_time=at))
    first = _judged(host_readiness(h, held, NOW))
    turn = readiness_turn(h, held, NOW)
    assert turn is None or turn > NOW
    for s in later:
        t = NOW + timedelta(seconds=s, microseconds=later_us)
        if turn is None or t < turn:
            assert _judged(host_readiness(h, held, t)) == first, t
    if turn is not None:
        assert _judged(host_readiness(h, held, turn - timedelta(microseconds=1))) == first
        if first[1]:
            assert not host_readiness(h, held, turn).ready
