"""Builders for hypervisors and reservations in scheduling tests."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from hvfleet.model import (
    Condition,
    Hypervisor,
    HypervisorSpec,
    HypervisorStatus,
    ObjectMeta,
    Quantity,
    Reservation,
    ReservationSpec,
    ReservationStatus,
    ResourceName,
)
from hvfleet.model.hypervisor import Instance
from hvfleet.store.base import Store
from hvfleet.store.ownership import agent_manager

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def q(v: str | int) -> Quantity:
    return Quantity.parse(v)


def rl(values: Mapping[str, str | int]) -> dict[ResourceName, Quantity]:
    return {ResourceName.parse(k): q(v) for k, v in values.items()}


def host(
    name: str,
    capacity: Mapping[str, str | int],
    *,
    allocation: Mapping[str, str | int] | None = None,
    reserved: Mapping[str, str | int] | None = None,
    extra: Mapping[str, str | int] | None = None,
    overcommit: Mapping[str, float] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    ready: str = "True",
    beat: datetime | None = NOW,
    maintenance: str = "",
    instances: list[str] | None = None,
) -> Hypervisor:
    return Hypervisor(
        metadata=ObjectMeta(name=name, labels=dict(labels or {}), annotations=dict(annotations or {})),
        spec=HypervisorSpec(
            overcommit={ResourceName.parse(k): v for k, v in (overcommit or {}).items()},
            reserved=rl(reserved or {}),
            extra_capacity=rl(extra or {}),
            maintenance=maintenance,  # type: ignore[arg-type]
            maintenance_reason="test" if maintenance == "manual" else "",
        ),
        status=HypervisorStatus(
            capacity=rl(capacity),
            allocation=rl(allocation or {}),
            conditions=[Condition(type="Ready", status=ready)],  # type: ignore[arg-type]
            last_heartbeat_time=beat,
            instances=[Instance(uuid=u, name=u, state="running") for u in instances or []],
        ),
    )


def reservation(
    name: str,
    hypervisor: str,
    resources: Mapping[str, str | int],
    *,
    consumer: str = "c",
    phase: str = "Active",
    expires_in: timedelta | None = None,
    source: str = "hvfleet",
) -> Reservation:
    return Reservation(
        metadata=ObjectMeta(name=name),
        spec=ReservationSpec(
            hypervisor=hypervisor,
            resources=rl(resources),
            consumer=consumer,
            expires_at=None if expires_in is None else NOW + expires_in,
            source=source,  # type: ignore[arg-type]
        ),
        status=ReservationStatus(phase=phase),  # type: ignore[arg-type]
    )


OPERATOR = "operator"


def put_host(store: Store, h: Hypervisor) -> Hypervisor:
    """Create `h` the way the system does: spec by an operator, status by the
    host's own agent (the only manager allowed to write it)."""
    created = store.create(h.model_copy(update={"status": HypervisorStatus()}), OPERATOR)
    out = store.update(created.model_copy(update={"status": h.status}), agent_manager(h.name))
    assert isinstance(out, Hypervisor)
    return out


def now() -> datetime:
    return datetime.now(UTC)
