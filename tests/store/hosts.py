"""Hosts as an agent reports them, for contract tests that claim space."""

from __future__ import annotations

from datetime import UTC, datetime

from hvfleet.model import Condition, Hypervisor, Quantity
from hvfleet.store import Store


def ready_host(store: Store, name: str, cpu: int) -> Hypervisor:
    """A host as its agent reports it: capacity, Ready, a fresh heartbeat and a
    live Lease, so a claim's check judges its room alone."""
    store.create(Hypervisor.model_validate({"metadata": {"name": name}}), "operator")

    def observed(h: Hypervisor) -> Hypervisor:
        status = h.status.model_copy(update={
            "capacity": {"cpu": Quantity(cpu), "memory": Quantity.parse("16Gi")},
            "conditions": [Condition(type="Ready", status="True")],
            "last_heartbeat_time": datetime.now(UTC)})
        return h.model_copy(update={"status": status})

    h = store.update_hypervisor(name, observed, f"agent/{name}")
    store.keepalive(name, 60)
    return h
