"""The tables and documents every edge shows (CLI, API Table, dashboard), by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hvfleet import views
from hvfleet.model import Condition, Hypervisor, Quantity, Reservation, ResourceName
from hvfleet.model.spec_sync import spec_sync

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def hv(name: str, **spec: Any) -> Hypervisor:
    return Hypervisor.model_validate({
        "metadata": {"name": name, "labels": {"az": "a"}, "creationTimestamp": NOW - timedelta(hours=5)},
        "spec": spec,
        "status": {
            "capacity": {"cpu": 16, "memory": "64Gi"},
            "allocation": {"cpu": 10, "memory": "20Gi"},
            "conditions": [Condition(type="Ready", status="True").to_dict()],
            "lastHeartbeatTime": NOW,
            "instances": [{"uuid": "u1", "name": "vm1", "state": "running"}],
        },
    })


def test_hypervisor_columns_and_row() -> None:
    assert [c.name for c in views.hypervisor_columns()] == [
        "NAME", "READY", "CPU", "MEMORY", "INSTANCES", "MAINTENANCE", "SYNCED", "AGE"]
    wide = views.hypervisor_columns(wide=True)
    assert [c.name for c in wide][8:] == ["OVERCOMMIT", "RESERVED", "LABELS"]
    assert [c.priority for c in wide] == [0] * 8 + [1] * 3
    assert wide[0].to_dict() == {"name": "NAME", "type": "string", "format": "name",
                                 "description": "metadata.name", "priority": 0}
    h = hv("a", overcommit={"cpu": 4}, reserved={"memory": "4Gi"})
    # Never observed by an agent (no observedGeneration): SYNCED Unknown.
    assert views.hypervisor_row(h, NOW) == ["a", "Ready", "10/64", "20Gi/60Gi", "1", "-", "Unknown", "5h"]
    assert views.hypervisor_row(h, NOW, lease_live=False, wide=True) == [
        "a", "NotReady", "10/64", "20Gi/60Gi", "1", "-", "Unknown", "5h", "cpu=4", "memory=4Gi", "az=a"]


def test_fleet_capacity_document_and_rows() -> None:
    a = hv("a", overcommit={"cpu": 0.5})  # 8 effective, 10 allocated: overcommitted
    b = hv("b", extraCapacity={"VGPU": 2})
    res = Reservation.model_validate({
        "metadata": {"name": "r"},
        "spec": {"hypervisor": "b", "consumer": "c", "resources": {"memory": "40Gi"}},
        "status": {"phase": "Active"},
    })
    doc = views.fleet_summary([a, b], [res], {"b": True}, NOW).to_dict()
    assert doc["hosts"][0]["ready"] is True and doc["hosts"][0]["readiness"]["state"] == "Ready"
    assert doc["hosts"][0]["free"] == {"cpu": "-2", "memory": "44Gi"}
    assert doc["hosts"][1]["free"] == {"VGPU": "2", "cpu": "6", "memory": "4Gi"}
    assert doc["total"] == {
        "effective": {"VGPU": "2", "cpu": "24", "memory": "128Gi"},
        "allocation": {"cpu": "20", "memory": "40Gi"},
        "free": {"VGPU": "2", "cpu": "4", "memory": "48Gi"},
    }
    summary = views.fleet_summary([a, b], [res], {}, NOW)
    assert [c.name for c in views.capacity_columns(summary)] == [
        "HOST", "READY", "SYNCED", "CPU USED/EFFECTIVE", "MEMORY USED/EFFECTIVE", "VGPU USED/EFFECTIVE",
        "CPU FREE", "MEMORY FREE", "VGPU FREE"]
    rows = views.capacity_rows(summary)
    assert rows[0].cells == [
        "a", "Ready", "Unknown", "10/8", "20Gi/64Gi", "0/-", "-2 (overcommitted)", "44Gi", "-"]
    assert rows[0].levels[6] == "overcommitted"
    assert rows[1].cells[7] == "4Gi" and rows[1].levels[7] == "low"  # 4Gi < 10% of 64Gi
    assert rows[2].total and rows[2].cells[:3] == ["TOTAL", "", ""]


def test_free_level_and_human() -> None:
    assert views.free_level(Quantity(-1), Quantity(8)) == "overcommitted"
    assert views.free_level(Quantity(0), Quantity(0)) == "ok"
    assert views.free_level(Quantity(9), Quantity(100)) == "low"
    assert views.free_level(Quantity(10), Quantity(100)) == "ok"
    assert views.human("memory", Quantity.parse("1536Mi")) == "1.5Gi"
    # A fleet's memory reaches Pi (10,000 hosts: "4.4Pi", not "4498.2Ti").
    assert views.human("memory", Quantity.parse("4498Ti")) == "4.4Pi"
    assert views.human("memory", Quantity.parse("1023Ti")) == "1023Ti"
    assert views.human("memory", Quantity.parse("3Ei")) == "3Ei"
    assert views.human("cpu", Quantity.parse("500m")) == "500m"
    assert views.human("cpu", None) == "-"
    assert views.age(NOW - timedelta(days=2, hours=3), NOW) == "2d"
    assert views.age(NOW + timedelta(seconds=3), NOW) == "0s"


def test_spec_sync_says_when_status_effective_capacity_lags() -> None:
    h = hv("a", overcommit={"cpu": 1})
    assert spec_sync(h).state == "Unknown"
    meta = h.metadata.model_copy(update={"generation": 3})
    lagging = h.model_copy(update={
        "metadata": meta,
        "status": h.status.model_copy(update={
            "observed_generation": 2, "effective_capacity": {ResourceName("cpu"): Quantity(64)}}),
    })
    got = spec_sync(lagging)
    assert (got.state, got.pending, got.generation, got.observed_generation) == ("False", True, 3, 2)
    assert got.message.startswith("spec generation 3 not yet observed by the agent (it saw 2)")
    assert "cpu=64" in got.message
    assert views.hypervisor_row(lagging, NOW)[6] == "False"
    assert views.fleet_summary([lagging], [], {}, NOW).to_dict()["hosts"][0]["synced"] == got.to_dict()
    status = lagging.status.model_copy(update={"observed_generation": 3})
    observed = lagging.model_copy(update={"status": status})
    assert spec_sync(observed).state == "True"


def test_every_public_kind_has_one_table_and_says_an_empty_list_as_before() -> None:
    from hvfleet.model.kinds import public_kinds

    assert sorted(views.TABLES) == sorted(public_kinds())
    assert [views.TABLES[k].empty() for k in ("Hypervisor", "Reservation", "Lease",
                                              "OvercommitPolicy")] == [
        "No hypervisors found.", "No reservations found.", "No leases found.",
        "No overcommit policies found."]


def test_table_inputs_read_what_the_kinds_rows_need_from_a_store(tmp_path: Any) -> None:
    from hvfleet.store.sqlite import SqliteStore

    with SqliteStore(str(tmp_path / "t.db")) as store:
        store.create(Hypervisor.model_validate({"metadata": {"name": "a"}}), "ops")
        store.keepalive("a", 60)
        hv = views.table_inputs("Hypervisor", store)
        assert (dict(hv.liveness), dict(hv.hosts)) == ({"a": True}, {})
        res = views.table_inputs("Reservation", store)
        assert (dict(res.liveness), list(res.hosts)) == ({}, ["a"])
        assert views.table_inputs("Lease", store) == views.TableInputs()
