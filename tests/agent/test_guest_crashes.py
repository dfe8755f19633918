"""Guest crash events on the instance: counted once, kept across passes and
agent restarts (the count lives in the stored status), backward compatible,
and in the CRD; the real crash (pvpanic on QEMU) is in test_agent_qemu.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hvfleet.agent.reconcile import CrashEvent, add_instances, reconcile
from hvfleet.agent.runner import usable_dump_location
from hvfleet.model import Hypervisor
from hvfleet.model.crd import crds
from hvfleet.model.hypervisor import Instance

from .test_reconcile_steps import RUNNING, SHUTOFF, T0, facts, fresh


def test_crash_events_add_to_the_stored_count_once_per_event() -> None:
    f = facts()
    uuid = RUNNING.demand.uuid
    h = add_instances(fresh(), f)
    assert all(i.crash_count is None for i in h.status.instances)
    first = replace(f, crashes=(CrashEvent(uuid, T0, "panicked"),))
    h = add_instances(h, first)
    (inst,) = [i for i in h.status.instances if i.uuid == uuid]
    assert (inst.crash_count, inst.last_crash_time, inst.last_crash_reason) == (1, T0, "panicked")
    # a pass without new events keeps the record; new events add to it
    h = add_instances(h, f)
    later = T0 + timedelta(minutes=5)
    h = add_instances(h, replace(f, crashes=(CrashEvent(uuid, later, "crashloaded"),
                                             CrashEvent(uuid, T0, "panicked"))))
    (inst,) = [i for i in h.status.instances if i.uuid == uuid]
    assert (inst.crash_count, inst.last_crash_time, inst.last_crash_reason) == (
        3, later, "crashloaded")
    other = next(i for i in h.status.instances if i.uuid == SHUTOFF.demand.uuid)
    assert other.crash_count is None


def test_a_restarted_agent_continues_from_the_stored_count() -> None:
    uuid = RUNNING.demand.uuid
    stored = reconcile(fresh(), replace(facts(), crashes=(CrashEvent(uuid, T0, "panicked"),)))
    # the document as the store keeps it, read back by a new agent process
    again = Hypervisor.model_validate(stored.to_dict())
    h = reconcile(again, replace(facts(), crashes=(CrashEvent(uuid, T0, "panicked"),)))
    assert next(i for i in h.status.instances if i.uuid == uuid).crash_count == 2


def test_instances_without_crashes_serialize_as_before() -> None:
    old = {"uuid": "u", "name": "n", "state": "running", "resources": {"cpu": "1"}}
    inst = Instance.model_validate(old)
    assert inst.crash_count is None
    assert set(inst.to_dict()) == {"uuid", "name", "state", "resources"}
    crashed = inst.model_copy(update={"crash_count": 2, "last_crash_time": T0})
    d = crashed.to_dict()
    assert d["crashCount"] == 2 and d["lastCrashTime"].startswith("2026-01-01")


def test_crd_exports_the_crash_fields() -> None:
    crd = next(c for c in crds() if c["spec"]["names"]["kind"] == "Hypervisor")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    item = schema["properties"]["status"]["properties"]["instances"]["items"]["properties"]
    assert item["crashCount"]["type"] == "integer" and item["crashCount"]["minimum"] == 0
    assert item["lastCrashTime"]["format"] == "date-time"
    assert item["lastCrashReason"]["type"] == "string"


def test_dump_location_is_reported_only_while_writable(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path)) / "dumps"
    assert usable_dump_location(str(d)) is None
    d.mkdir()
    assert usable_dump_location(str(d)) == str(d)
    assert usable_dump_location(None) is None
