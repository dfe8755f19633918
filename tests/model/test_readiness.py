"""Readiness: one table of what every reader shows, and proof that the readers
(fit, the fleet index, the hypervisor table, the capacity summary) agree."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hvfleet import views
from hvfleet.model import Condition, Hypervisor
from hvfleet.model.readiness import DEFAULT_STALENESS, fresh_until, readiness
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
    (False, "True", TWO_HOURS, "drain", "NotReady", "AgentLeaseExpired"),
    (False, None, None, "", "NotReady", "AgentLeaseExpired"),
    # The Ready condition.
    (None, "False", FRESH, "", "NotReady", "Reconciled"),
    (None, "False", TWO_HOURS, "", "NotReady", "Reconciled"),
    (None, "Unknown", FRESH, "", "Unknown", "Reconciled"),
    (None, None, FRESH, "", "Unknown", "NoReadyCondition"),
    (None, None, None, "", "Unknown", "NoReadyCondition"),
    # Maintenance shows only on a healthy host; a sick one shows what is wrong.
    (None, "True", FRESH, "drain", "Maintenance", "Maintenance"),
    (True, "True", FRESH, "manual", "Maintenance", "Maintenance"),
    (None, "True", TWO_HOURS, "drain", "Stale", "HeartbeatStale"),
    (None, "False", FRESH, "manual", "NotReady", "Reconciled"),
]


@pytest.mark.parametrize(("live", "cond", "beat", "maintenance", "state", "reason"), TABLE)
def test_readiness_table(
    live: bool | None, cond: str | None, beat: datetime | None, maintenance: str, state: str, reason: str
) -> None:
    got = readiness(hv(cond, beat, maintenance), NOW, live)
    assert (got.state, got.reason) == (state, reason)
    assert got.ready is (state == "Ready")
    assert got.message


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
        assert views.hypervisor_row(h, NOW, live)[1] == r.state, where
        summary = views.fleet_summary([h], [], {} if live is None else {"hv": live}, NOW)
        assert summary.hosts[0].readiness == r, where
        if r.state == "Stale" and beat is not None:
            # The index compares fresh_until; readiness compares the age: same instant.
            until = fresh_until(h)
            assert until is not None and until < NOW
