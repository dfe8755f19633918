"""A Reservation's claim is the only write that checks free capacity (inside
the store's atomic write), so an update, on every backend and through apply,
must never make a reservation hold more than it was claimed with: no larger
or new resources, no other host, no revival of one that stopped holding
(Released, Expired). Shrinking it, releasing it, or recording it Confirmed
stay allowed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from hvfleet.model import Hypervisor, InvalidInput, Quantity, Reservation, ResourceName
from hvfleet.model.hypervisor import ReservationSpec, ReservationStatus
from hvfleet.model.meta import ObjectMeta
from hvfleet.store import Store
from hvfleet.store.apply import apply_manifests, load_manifests

MakeHv = Callable[..., Hypervisor]
CPU = ResourceName("cpu")


def _claimed(store: Store, name: str, host: str, cpu: int, **spec: object) -> Reservation:
    r = Reservation(
        metadata=ObjectMeta(name=name),
        spec=ReservationSpec(hypervisor=host, consumer=name, resources={CPU: Quantity(cpu)}, **spec),
        status=ReservationStatus(phase="Active"),
    )
    out = store.claim(r, "scheduler", lambda h, others: None)
    assert isinstance(out, Reservation)
    return out


def _with(r: Reservation, spec: dict[str, object] | None = None, phase: str | None = None) -> Reservation:
    out = r.model_copy(update={"spec": r.spec.model_copy(update=spec or {})})
    if phase is not None:
        out = out.model_copy(update={"status": r.status.model_copy(update={"phase": phase})})
    return out


def test_an_update_never_makes_a_reservation_hold_more(store: Store, make_hypervisor: MakeHv) -> None:
    store.create(make_hypervisor("hv1"), "operator")
    store.create(make_hypervisor("hv2"), "operator")
    r = _claimed(store, "r1", "hv1", 2)
    for grown in (
        _with(r, {"resources": {CPU: Quantity(4)}}),
        _with(r, {"resources": {CPU: Quantity(2), ResourceName("VGPU"): Quantity(1)}}),
        _with(r, {"hypervisor": "hv2"}),
    ):
        with pytest.raises(InvalidInput, match="claim"):
            store.update(grown, "scheduler")
    assert store.get("Reservation", "r1") == r
    smaller = store.update(_with(r, {"resources": {CPU: Quantity(1)}}), "scheduler")
    assert isinstance(smaller, Reservation)
    released = store.update(_with(smaller, phase="Released"), "scheduler")
    assert isinstance(released, Reservation)
    with pytest.raises(InvalidInput, match="claim"):
        store.update(_with(released, phase="Active"), "scheduler")
    past = datetime.now(UTC) - timedelta(minutes=1)
    e = _claimed(store, "r2", "hv1", 1, expires_at=past)
    with pytest.raises(InvalidInput, match="claim"):
        store.update(_with(e, {"expires_at": past + timedelta(hours=1)}), "scheduler")
    confirmed = store.update(_with(e, phase="Confirmed"), "scheduler")
    assert isinstance(confirmed, Reservation)


def test_apply_cannot_grow_a_reservation_around_the_claim(store: Store, make_hypervisor: MakeHv) -> None:
    store.create(make_hypervisor("hv1"), "operator")
    _claimed(store, "r1", "hv1", 2)
    docs = load_manifests(
        "apiVersion: hvfleet.io/v1\nkind: Reservation\nmetadata: {name: r1}\n"
        "spec: {hypervisor: hv1, consumer: r1, resources: {cpu: 8}}\n",
        "r.yaml",
    )
    with pytest.raises(InvalidInput, match="claim"):
        apply_manifests(store, docs, "scheduler")
    got = store.get("Reservation", "r1")
    assert isinstance(got, Reservation) and got.spec.resources == {CPU: 2}


def test_a_placement_mirror_follows_placement(store: Store, make_hypervisor: MakeHv) -> None:
    # `placement sync` mirrors what Placement allocated: Placement decided, not a claim.
    store.create(make_hypervisor("hv1"), "operator")
    r = _claimed(store, "m1", "hv1", 2, source="placement")
    grown = store.update(_with(r, {"resources": {CPU: Quantity(3)}}), "scheduler")
    assert isinstance(grown, Reservation) and grown.spec.resources == {CPU: 3}
