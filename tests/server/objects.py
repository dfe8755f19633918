"""Paths and documents the in-process API tests share (tests/server/conftest.py
make_api): the collection paths, a Hypervisor and a Reservation document, a
Ready host written as its agent, a Status check, the Table media type."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hvfleet.model import Hypervisor
from tests.server.running import Api

HV = "/apis/hvfleet.io/v1/hypervisors"
RES = "/apis/hvfleet.io/v1/reservations"


def hypervisor(name: str = "hv1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
            "metadata": {"name": name, "labels": {"rack": "a"}}, "spec": spec}


def status_of(code: int, reason: str, body: dict[str, Any]) -> None:
    assert body["kind"] == "Status" and body["apiVersion"] == "v1", body
    assert body["status"] == "Failure"
    assert (body["code"], body["reason"]) == (code, reason), body


TABLE = ("application/json;as=Table;v=v1;g=meta.k8s.io,"
         "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")


def ready_host(api: Api, name: str = "hv1", cpu: str = "8") -> None:
    made = api.client().post(HV, json=hypervisor(name)).json()
    status = {"capacity": {"cpu": cpu, "memory": "16Gi"}, "effectiveCapacity": {"cpu": cpu, "memory": "16Gi"},
              "conditions": [{"type": "Ready", "status": "True"}],
              "lastHeartbeatTime": datetime.now(UTC).isoformat()}
    h = Hypervisor.model_validate({**made, "status": status})
    api.store.update(h, f"agent/{name}")


def reservation(name: str, cpu: str, consumer: str = "vm-1", host: str = "hv1") -> dict[str, Any]:
    return {"apiVersion": "hvfleet.io/v1", "kind": "Reservation", "metadata": {"name": name},
            "spec": {"hypervisor": host, "resources": {"cpu": cpu}, "consumer": consumer}}


def agent_reports(api: Api, name: str, cpu_used: str) -> None:
    """What an agent does: write its host's status through the API."""
    c = api.client(f"agent-{name}-token")
    status = {"capacity": {"cpu": "16", "memory": "64Gi"}, "allocation": {"cpu": cpu_used},
              "conditions": [{"type": "Ready", "status": "True"}],
              "lastHeartbeatTime": datetime.now(UTC).isoformat()}
    r = c.patch(f"{HV}/{name}/status", {"status": status})
    assert r.status_code == 200, r.text
