"""The agent's liveness Lease, shaped as Kubernetes' coordination.k8s.io/v1 Lease.

As a kubelet renews its node Lease in `kube-node-lease`, each hvfleet agent
renews one small `Lease` (hvfleet.io/v1, cluster-scoped, named after its
Hypervisor) every few seconds, so a live host whose state did not change need
not rewrite its whole status. Only the agent of that hypervisor
(`agent/<name>`) writes it (enforced in `hvfleet.store.ownership`).

`lease_live(lease, now)` is the one rule for whether a lease still proves its
holder alive: a holder, and a renewal younger than the lease's duration.
Readers weigh it as Kubernetes' node lifecycle does: a live lease is the
heartbeat (status may be minutes old because nothing changed), an expired one
overrides whatever the last status says, and only a host with no Lease at all
falls back to `status.lastHeartbeatTime`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import Field

from hvfleet.model.bounds import MAX_LEASE_SECONDS, MAX_NAME, Count, Timestamp
from hvfleet.model.meta import Model, ObjectMeta, StoredObject

# What a reader takes for "never expires": a lease whose expiry a datetime cannot
# hold (stored before the bounds existed, or written around them) is live, not
# an OverflowError in every reader.
_END_OF_TIME = datetime.max.replace(tzinfo=UTC)


class LeaseSpec(Model):
    # Who holds the lease: `agent/<hypervisor name>`; empty once released.
    holder_identity: str = Field(default="", max_length=MAX_NAME)
    lease_duration_seconds: int = Field(default=30, ge=1, le=MAX_LEASE_SECONDS)
    acquire_time: Timestamp | None = None
    renew_time: Timestamp | None = None
    lease_transitions: Count = 0


class Lease(StoredObject):
    kind: Literal["Lease"] = "Lease"
    spec: LeaseSpec = Field(default_factory=LeaseSpec)


def lease_expiry(lease: Lease) -> datetime | None:
    """When the lease stops proving its holder alive (None: it does not now)."""
    spec = lease.spec
    if not spec.holder_identity or spec.renew_time is None:
        return None
    renew = spec.renew_time if spec.renew_time.tzinfo else spec.renew_time.replace(tzinfo=UTC)
    try:
        return renew + timedelta(seconds=spec.lease_duration_seconds)
    except OverflowError:
        return _END_OF_TIME


def lease_live(lease: Lease, now: datetime) -> bool:
    """Whether `lease` is held and was renewed less than its duration before `now`."""
    expiry = lease_expiry(lease)
    return expiry is not None and now < expiry


def renewed(
    current: Lease | None, name: str, holder: str, duration_seconds: int, now: datetime
) -> Lease:
    """The Lease `name` after `holder` renews it for `duration_seconds` at `now`:
    a new holder (or one coming back after a release or an expiry) acquires it
    anew, as Kubernetes' leader election counts transitions."""
    if current is None:
        return Lease(
            metadata=ObjectMeta(name=name),
            spec=LeaseSpec(
                holder_identity=holder, lease_duration_seconds=duration_seconds,
                acquire_time=now, renew_time=now,
            ),
        )
    spec = current.spec
    taken_over = spec.holder_identity != holder or not lease_live(current, now)
    new_spec = spec.model_copy(update={
        "holder_identity": holder,
        "lease_duration_seconds": duration_seconds,
        "renew_time": now,
        "acquire_time": now if taken_over else spec.acquire_time,
        "lease_transitions": spec.lease_transitions + (1 if taken_over and spec.acquire_time else 0),
    })
    return current.model_copy(update={"spec": new_spec})


def released(current: Lease) -> Lease:
    """The Lease after its holder lets go on a clean stop: not live from now on."""
    return current.model_copy(
        update={"spec": current.spec.model_copy(update={"holder_identity": ""})}
    )
