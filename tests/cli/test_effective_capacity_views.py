"""One rule for effective capacity: every view computes it from the current spec
and the observed capacity (model.capacity), and says when the agent has not
observed that spec yet (generation > observedGeneration), so
`status.effectiveCapacity` lags. The real agent on libvirt's test driver,
the real `hvfleet` entry point, a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvfleet.model import ResourceName
from hvfleet.model.spec_sync import spec_sync
from hvfleet.scheduling.index import FleetIndex
from hvfleet.store import open_store

from .conftest import Run

ROOT = Path(__file__).resolve().parents[2]
EDGE = f"test://{ROOT}/examples/fleet/edge-01.xml"
CPU = ResourceName("cpu")


def _row(out: str, host: str) -> list[str]:
    return next(line for line in out.splitlines() if line.startswith(host + " ")).split()


def _views(run: Run, db_url: str) -> dict[str, Any]:
    """What each view says of edge-01's cpu and whether its spec is observed."""
    get = run("get", "hypervisors").out
    header = get.splitlines()[0].split()
    row = _row(get, "edge-01")
    cap = json.loads(run("capacity", "-o", "json").out)["hosts"][0]
    table = run("capacity").out
    describe = run("describe", "hypervisor", "edge-01").out
    cpu_line = _row(describe, "cpu")
    fit = json.loads(run("fit", "--cpu", "4", "-o", "json", "--why").out)
    export = json.loads(run("placement", "export", "-o", "json").out)["resource_providers"][0]
    vcpu = export["inventories"]["VCPU"]
    with open_store(db_url) as s:
        h = s.get_hypervisor("edge-01")
        index = FleetIndex.from_store(s)
    return {
        "get": row[header.index("CPU")].split("/")[1],
        "get synced": row[header.index("SYNCED")],
        "capacity": cap["effective"]["cpu"],
        "capacity synced": cap["synced"]["state"],
        "capacity table": _row(table, "edge-01")[3].split("/")[1],
        "describe": cpu_line[5],
        "describe cell": _row(describe, "0")[3] if _row(describe, "0")[1] == "cpu" else "?",
        "describe pending": "not yet observed by the agent" in describe,
        "fit free": next((c["free"]["cpu"] for c in fit["candidates"]), None),
        "index effective": str(index.free("edge-01")[CPU] + 5),  # free + allocated
        "placement": str(int((vcpu["total"] - vcpu["reserved"]) * vcpu["allocation_ratio"])),
        "status": str(h.status.effective_capacity[CPU]),
        "api value": spec_sync(h).to_dict()["state"],
    }


def test_after_overcommit_set_every_view_agrees_and_says_the_agent_lags(
    run: Run, db_url: str, tmp_path: Path
) -> None:
    spec = tmp_path / "edge.yaml"
    spec.write_text("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata: {name: edge-01}\n"
                    "spec: {overcommit: {cpu: 8}}\n")
    assert run("apply", "-f", str(spec)).code == 0
    got = run("agent", "--connect", EDGE, "--once")
    assert got.code == 0, got
    before = _views(run, db_url)
    # 8 logical CPUs × 8, and 5 vCPUs allocated by the test driver's domains.
    assert before == {
        "get": "64", "get synced": "True", "capacity": "64", "capacity synced": "True",
        "capacity table": "64", "describe": "64", "describe cell": "64", "describe pending": False,
        "fit free": "59",
        "index effective": "64", "placement": "64", "status": "64", "api value": "True",
    }

    assert run("overcommit", "set", "edge-01", "cpu=1").code == 0
    lagging = _views(run, db_url)
    assert lagging == {
        "get": "8", "get synced": "False", "capacity": "8", "capacity synced": "False",
        "capacity table": "8", "describe": "8", "describe cell": "8", "describe pending": True,
        "fit free": None,
        "index effective": "8", "placement": "8",
        "status": "64",  # the agent has not run: its status still says 64, and every view says so
        "api value": "False",
    }

    assert run("agent", "--connect", EDGE, "--once").code == 0
    after = _views(run, db_url)
    assert after == {**lagging, "get synced": "True", "capacity synced": "True",
                     "describe pending": False, "status": "8", "api value": "True"}
