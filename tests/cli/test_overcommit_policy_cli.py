"""OvercommitPolicy through the real entry point on a real SQLite store: apply,
get, export, delete, and every capacity view (get, describe, capacity, fit,
placement export) taking the policy's ratio where a host says nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from hvfleet.model import Condition, Quantity, ResourceName
from hvfleet.store import open_store

from .conftest import Run

FLEET = """\
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata: {name: c-1, labels: {role: compute}}
---
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata: {name: c-2, labels: {role: compute}}
spec: {overcommit: {cpu: 2}}
---
apiVersion: hvfleet.io/v1
kind: Hypervisor
metadata: {name: g-1, labels: {role: gpu}}
"""

POLICIES = """\
apiVersion: hvfleet.io/v1
kind: OvercommitPolicy
metadata: {name: compute-default}
spec:
  selector: {matchLabels: {role: compute}}
  overcommit: {cpu: 4, memory: 1.5}
---
apiVersion: hvfleet.io/v1
kind: OvercommitPolicy
metadata: {name: fleet-floor}
spec:
  priority: -10
  overcommit: {cpu: 1.5}
"""


@pytest.fixture
def fleet(run: Run, tmp_path: Path, db_url: str) -> str:
    (tmp_path / "fleet.yaml").write_text(FLEET)
    assert run("apply", "-f", str(tmp_path / "fleet.yaml")).code == 0
    with open_store(db_url) as s:
        for h in s.list_hypervisors():
            status = h.status.model_copy(
                update={
                    "capacity": {
                        ResourceName("cpu"): Quantity(8),
                        ResourceName("memory"): Quantity.parse("16Gi"),
                    },
                    "allocation": {ResourceName("cpu"): Quantity(6)},
                    "conditions": [Condition(type="Ready", status="True")],
                    "last_heartbeat_time": datetime.now(UTC),
                }
            )
            s.update(h.model_copy(update={"status": status}), f"agent/{h.name}")
    (tmp_path / "policies.yaml").write_text(POLICIES)
    r = run("apply", "-f", str(tmp_path / "policies.yaml"))
    assert r.code == 0, r.err
    assert "overcommitpolicy/compute-default created" in r.out
    return db_url


def effective(run: Run) -> dict[str, dict[str, str]]:
    doc = json.loads(run("capacity", "-o", "json").out)
    return {h["name"]: h["effective"] for h in doc["hosts"]}


def test_every_view_takes_the_policy_ratio_where_the_host_says_nothing(run: Run, fleet: str) -> None:
    # c-1: policy cpu 4, memory 1.5; c-2: its own cpu 2, policy memory 1.5; g-1: the floor's cpu 1.5.
    assert effective(run) == {
        "c-1": {"cpu": "32", "memory": "24Gi"},
        "c-2": {"cpu": "16", "memory": "24Gi"},
        "g-1": {"cpu": "12", "memory": "16Gi"},
    }
    table = run("get", "hypervisors").out
    assert "6/32" in table and "6/16" in table and "6/12" in table
    wide = run("get", "hypervisors", "-o", "wide").out
    assert "cpu=4(compute-default)" in wide and "cpu=2,memory=1.5(compute-default)" in wide
    described = run("describe", "hypervisor", "c-2").out
    assert "compute-default, fleet-floor" in described  # the matching policies, in precedence order
    assert "1.5(compute-default)" in described
    fit = json.loads(run("fit", "--cpu", "20", "-o", "json").out)
    assert [c["name"] for c in fit["candidates"]] == []  # max_unit: one guest is at most 8
    fit = json.loads(run("fit", "--cpu", "8", "--count", "3", "-o", "json").out)
    assert [c["name"] for c in fit["candidates"]] == ["c-1"]  # 32 − 6 = 26 free ≥ 24
    export = json.loads(run("placement", "export", "-o", "json").out)
    ratios = {
        rp["name"]: rp["inventories"]["VCPU"]["allocation_ratio"] for rp in export["resource_providers"]
    }
    assert ratios == {"c-1": 4.0, "c-2": 2.0, "g-1": 1.5}
    vm = "00000000-0000-4000-8000-000000000001"
    assert run("reserve", "c-1", "--cpu", "8", "--count", "3", "--consumer", vm).code == 0


def test_overcommit_unset_falls_back_to_the_policy_and_delete_to_one(run: Run, fleet: str) -> None:
    assert run("overcommit", "unset", "c-2", "cpu").code == 0
    assert effective(run)["c-2"]["cpu"] == "32"
    r = run("overcommit", "set", "-l", "role=compute", "cpu=3")
    assert r.code == 0 and "cpu=24" in r.out
    assert effective(run)["c-1"]["cpu"] == "24"
    assert run("delete", "overcommitpolicy", "compute-default").code == 0
    assert run("delete", "overcommitpolicies", "fleet-floor").code == 0
    assert effective(run) == {
        "c-1": {"cpu": "24", "memory": "16Gi"},
        "c-2": {"cpu": "24", "memory": "16Gi"},
        "g-1": {"cpu": "8", "memory": "16Gi"},
    }


def test_get_export_and_apply_round_trip_policies(run: Run, fleet: str, tmp_path: Path) -> None:
    r = run("get", "overcommitpolicies")
    assert r.code == 0
    lines = [
        line.split() for line in r.out.splitlines() if "compute-default" in line or "fleet-floor" in line
    ]
    assert lines[0][:5] == ["compute-default", "0", "role=compute", "cpu=4,memory=1.5", "2"]
    assert lines[1][:5] == ["fleet-floor", "-10", "(all)", "cpu=1.5", "3"]
    doc = json.loads(run("get", "overcommitpolicy", "compute-default", "-o", "json").out)
    assert doc["spec"]["selector"] == {"matchLabels": {"role": "compute"}, "matchExpressions": []}
    exported = run("export", "--kind", "overcommitpolicies").out
    docs = list(yaml.safe_load_all(exported))
    assert [d["metadata"]["name"] for d in docs] == ["compute-default", "fleet-floor"]
    assert docs[1]["spec"] == {"overcommit": {"cpu": 1.5}, "priority": -10}
    # Export → delete → apply gives the same policies back.
    for d in docs:
        assert run("delete", "overcommitpolicy", d["metadata"]["name"]).code == 0
    assert run("get", "overcommitpolicies").err.strip() == "No overcommit policies found."
    (tmp_path / "back.yaml").write_text(exported)
    assert run("apply", "-f", str(tmp_path / "back.yaml")).code == 0
    assert effective(run)["c-1"]["cpu"] == "32"
    # A change through apply is a normal spec update, with ownership like any other.
    changed = exported.replace("cpu: 4", "cpu: 5")
    (tmp_path / "changed.yaml").write_text(changed)
    assert run("apply", "-f", str(tmp_path / "changed.yaml"), "--manager", "cortex").code == 4
    assert run("apply", "-f", str(tmp_path / "changed.yaml")).code == 0
    assert effective(run)["c-1"]["cpu"] == "40"


def test_an_invalid_policy_is_refused_and_nothing_is_written(run: Run, fleet: str, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: hvfleet.io/v1\nkind: OvercommitPolicy\nmetadata: {name: bad}\n"
        "spec: {overcommit: {cpu: -1}}\n"
    )
    r = run("apply", "-f", str(tmp_path / "bad.yaml"))
    assert r.code == 2 and "overcommit.cpu: -1 must be greater than 0" in r.err
    assert "bad" not in run("get", "overcommitpolicies").out
