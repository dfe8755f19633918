"""Capacity arithmetic, with every expected value computed by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model import Hypervisor, Quantity, Reservation, ResourceName
from hvfleet.model import capacity as cap

GI = 2**30
R = ResourceName.parse


def q(values: dict[str, Any]) -> dict[ResourceName, Quantity]:
    return {R(k): Quantity.parse(v) for k, v in values.items()}


# (capacity, extra, reserved, overcommit, expected effective), all by hand.
TABLE = [
    # Seed: no reserve, no ratio → capacity itself.
    ({"cpu": 16}, {}, {}, {}, {"cpu": 16}),
    # cpu: (16 − 2) × 4 = 56; memory: (64 − 8) Gi × 1.5 = 84 Gi.
    ({"cpu": 16, "memory": "64Gi"}, {}, {"cpu": 2, "memory": "8Gi"}, {"cpu": 4, "memory": 1.5},
     {"cpu": 56, "memory": "84Gi"}),
    # Fractional ratio with floor: (10 − 0) × 1.1 = 11 exactly (not 11.000000000000002 → 11).
    ({"cpu": 10}, {}, {}, {"cpu": 1.1}, {"cpu": 11}),
    # 7 × 1.3 = 9.1 → 9.
    ({"cpu": 7}, {}, {}, {"cpu": 1.3}, {"cpu": 9}),
    # The float 0.29 × 100 is 28.999999999999996; taken at its decimal it is 29.
    ({"cpu": 100}, {}, {}, {"cpu": 0.29}, {"cpu": 29}),
    # Ratio below 1 keeps part free: (32 − 0) × 0.5 = 16; (9 GiB) × 0.7 = 6.3 → 6 GiB.
    ({"cpu": 32, "disk": "9Gi"}, {}, {}, {"cpu": 0.5, "disk": 0.7}, {"cpu": 16, "disk": "6Gi"}),
    # Reserve larger than capacity: 0, never negative.
    ({"cpu": 4, "memory": "2Gi"}, {}, {"cpu": 8, "memory": "4Gi"}, {"cpu": 16}, {"cpu": 0, "memory": 0}),
    # Extra capacity for what libvirt cannot see: (0 + 4 − 1) × 2 = 6 VGPUs.
    ({"cpu": 8}, {"VGPU": 4}, {"VGPU": 1}, {"VGPU": 2}, {"cpu": 8, "VGPU": 6}),
    # A ratio or reserve for a resource the host does not have adds nothing.
    ({"cpu": 8}, {}, {"pcpu": 2}, {"memory": 2}, {"cpu": 8}),
    # A fractional ratio: 1000 MiB × 1.5 = 1500 MiB; 1001 GiB × 1.5 = 1501.5 → 1501 GiB.
    ({"memory": "1000Mi", "disk": "1001Gi"}, {}, {}, {"memory": 1.5, "disk": 1.5},
     {"memory": "1500Mi", "disk": "1501Gi"}),
    # Whole Placement units, as Nova reports them: a total rounded down (10^9 B is
    # 953.67 MiB → 953 MiB; × 1.5 = 1429.5 → 1429 MiB), a reserve rounded up
    # (500m cpu → 1: (4 − 1) × 16 = 48, not 3.5 × 16 = 56).
    ({"cpu": 4, "memory": 10**9}, {}, {"cpu": "500m"}, {"cpu": 16, "memory": 1.5},
     {"cpu": 48, "memory": "1429Mi"}),
    # Memory the reserve takes part of a MiB from: ⌊2 GiB + 1 B⌋ − ⌈1 MiB + 1 B⌉ = 2046 MiB.
    ({"memory": 2 * GI + 1}, {}, {"memory": 2**20 + 1}, {}, {"memory": "2046Mi"}),
    # Less than one unit is nothing: 500m of VGPU extra capacity, 1 KiB of disk.
    ({"disk": "1Ki"}, {"VGPU": "500m"}, {}, {}, {"disk": 0, "VGPU": 0}),
    # Any hugepage size counts whole pages: ⌊10 pages + 1 MiB⌋ − ⌈1 page + 1 B⌉
    # of 32 MiB pages = 8 pages; 64 KiB pages likewise (⌊160Ki / 64Ki⌋ = 2 pages).
    ({"hugepages-32Mi": 320 * 2**20 + 2**20, "hugepages-64Ki": "160Ki"}, {},
     {"hugepages-32Mi": 32 * 2**20 + 1}, {}, {"hugepages-32Mi": "256Mi", "hugepages-64Ki": "128Ki"}),
]


@pytest.mark.parametrize(("capacity", "extra", "reserved", "ratios", "expected"), TABLE)
def test_effective_capacity_by_hand(
    capacity: dict[str, Any], extra: dict[str, Any], reserved: dict[str, Any],
    ratios: dict[str, float], expected: dict[str, Any],
) -> None:
    got = cap.effective_capacity(q(capacity), {R(k): v for k, v in ratios.items()}, q(reserved), q(extra))
    assert got == q(expected)


def hv(**spec: Any) -> Hypervisor:
    status = spec.pop("status", {})
    return Hypervisor.model_validate({"metadata": {"name": "hv1"}, "spec": spec, "status": status})


def test_max_unit_ignores_overcommit() -> None:
    h = hv(overcommit={"cpu": 8}, reserved={"cpu": 2}, status={"capacity": {"cpu": 16}})
    assert cap.max_unit(h) == q({"cpu": 14})
    assert cap.hypervisor_effective_capacity(h) == q({"cpu": 112})


def reservation(name: str, cpu: int, consumer: str, **extra: Any) -> Reservation:
    status = extra.pop("status", {})
    return Reservation.model_validate({
        "metadata": {"name": name},
        "spec": {"hypervisor": "hv1", "resources": {"cpu": cpu}, "consumer": consumer, **extra},
        "status": status,
    })


def test_free_subtracts_allocation_and_only_holding_reservations() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    h = hv(
        overcommit={"cpu": 2},
        status={"capacity": {"cpu": 16}, "allocation": {"cpu": 10},
                "instances": [{"uuid": "vm-running", "name": "vm", "state": "running",
                               "resources": {"cpu": 2}}]},
    )
    rs = [
        reservation("pending", 3, "vm-a"),                                          # holds 3
        reservation("active", 4, "vm-b", status={"phase": "Active"}),              # holds 4
        reservation("confirmed", 2, "vm-running"),                                  # now allocated
        reservation("expired", 5, "vm-c", expiresAt=(now - timedelta(seconds=1)).isoformat()),
        reservation("released", 6, "vm-d", status={"phase": "Released"}),
    ]
    # 32 effective − 10 allocated − (3 + 4) held = 15
    assert cap.free_capacity(h, rs, now) == q({"cpu": 15})
    phases = [cap.reservation_phase(r, h, now) for r in rs]
    assert phases == ["Pending", "Active", "Confirmed", "Expired", "Released"]


def test_free_goes_negative_when_overcommitted() -> None:
    h = hv(status={"capacity": {"cpu": 4}, "allocation": {"cpu": 6}})
    assert cap.free_capacity(h) == q({"cpu": -2})


def test_cells_get_a_proportional_share_of_the_host_reserve() -> None:
    h = hv(
        overcommit={"cpu": 2}, reserved={"cpu": 4, "memory": "4Gi"},
        status={"capacity": {"cpu": 16, "memory": "64Gi"},
                "cells": [{"id": 0, "capacity": {"cpu": 8, "memory": "48Gi"}},
                          {"id": 1, "capacity": {"cpu": 8, "memory": "16Gi"}}]},
    )
    out = cap.with_effective_capacity(h)
    # cell 0: cpu (8 − 2) × 2 = 12; memory 48Gi − 3Gi (¾ of the reserve) = 45Gi
    # cell 1: cpu (8 − 2) × 2 = 12; memory 16Gi − 1Gi = 15Gi
    assert out.status.cells[0].effective_capacity == q({"cpu": 12, "memory": "45Gi"})
    assert out.status.cells[1].effective_capacity == q({"cpu": 12, "memory": "15Gi"})
    assert out.status.effective_capacity == q({"cpu": 24, "memory": "60Gi"})


@given(
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=10**6),
    st.decimals(min_value="0.01", max_value="64", places=2),
)
def test_effective_is_floor_of_exact_product_and_never_negative(
    capacity: int, reserved: int, ratio: Any
) -> None:
    got = cap.effective_capacity(q({"cpu": capacity}), {R("cpu"): float(ratio)}, q({"cpu": reserved}))
    exact = max(capacity - reserved, 0) * ratio
    assert got[R("cpu")].value == int(exact)  # floor of a non-negative exact decimal
    assert got[R("cpu")] >= 0


@given(
    st.integers(min_value=0, max_value=2**50),
    st.integers(min_value=0, max_value=2**40),
    st.integers(min_value=0, max_value=2**50),
    st.sampled_from(["binary", "decimal"]),
    st.sampled_from([None, 1.0, 1.5, 0.7]),
)
def test_usable_and_effective_keep_the_exact_value_and_the_capacitys_form(
    capacity: int, extra: int, reserved: int, fmt: Any, ratio: float | None
) -> None:
    """With or without a ratio, reserve or extra capacity: the exact formula
    in whole MiB (total down, reserve up), in the capacity's own form (binary
    stays binary), as before the shortcuts that hand back the usable quantity
    itself where the ratio is 1."""
    from fractions import Fraction
    from math import floor

    mem = R("memory")
    caps = {mem: Quantity(capacity, fmt)}
    extras = {mem: Quantity(extra)} if extra else {}
    reserve = {mem: Quantity(reserved)}
    form = fmt if capacity else "decimal"  # a zero capacity has no form of its own (nor the extra)
    from math import ceil

    mib = 2**20  # memory counts whole MiB, as Placement's MEMORY_MB
    usable = cap.usable_capacity(caps, reserve, extras)[mem]
    whole = max((capacity + extra) // mib - ceil(reserved / mib), 0)
    assert usable.value == whole * mib and usable.format == form
    eff = cap.effective_capacity(caps, {mem: ratio} if ratio is not None else {}, reserve, extras)[mem]
    assert eff.value == floor(whole * Fraction(repr(ratio or 1.0))) * mib
    assert eff.format == form and str(eff) == str(Quantity(eff.value, form))
    assert cap.subtract({mem: usable}, {}) == {mem: usable}
    assert cap.subtract({mem: usable}, {}) == cap.subtract({mem: usable}, {mem: Quantity(0)})


def test_an_instance_at_a_size_that_is_not_whole_mib_is_counted_once_to_the_unit() -> None:
    """Probe 14: a claim of 191 MiB whose instance libvirt counts at 200M
    (190.73 MiB) held the 0.27 MiB left rounded up to a whole MiB, on top of
    the host's allocation rounded up: the instance cost 192 units, the host
    showed −1 MiB free, and re-sending its unchanged allocation was refused.
    What a claim has beyond libvirt's count is rounded down: the part of a
    unit libvirt counts is in the host's allocation, which is rounded up."""
    from hvfleet.scheduling.placement import export_usages

    mib = 2**20
    now = datetime(2026, 1, 1, tzinfo=UTC)
    x, z = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"

    def claim(name: str, consumer: str, memory: int) -> Reservation:
        return Reservation.model_validate({
            "metadata": {"name": name},
            "spec": {"hypervisor": "hv1", "consumer": consumer, "resources": {"memory": memory * mib}},
            "status": {"phase": "Active"}})

    claims = [claim("x", x, 191), claim("z", z, 666)]
    before = hv(status={"capacity": {"memory": 1000 * 10**6}, "allocation": {"memory": 100 * 10**6}})
    # ⌊953.67⌋ − ⌈95.37⌉ − 191 − 666 = 0: full.
    assert cap.free_capacity(before, claims, now) == q({"memory": 0})
    booted = hv(status={"capacity": {"memory": 1000 * 10**6}, "allocation": {"memory": 300 * 10**6},
                        "countMode": "running",
                        "instances": [{"uuid": x, "name": "x", "state": "running",
                                       "resources": {"memory": 200 * 10**6}}]})
    # ⌈286.1⌉ = 287 counted by libvirt, x holds ⌊191 − 190.73⌋ = 0 more, z 666: still full, not −1.
    assert cap.free_capacity(booted, claims, now) == q({"memory": 0})
    assert export_usages(booted, claims, now) == {"MEMORY_MB": 953}
    # x's unchanged allocation sent again needs nothing more.
    assert cap.claim_holds(x, claims[0].spec.resources, booted) == {}


def test_the_cells_carry_the_host_reserve_once_not_rounded_up_in_each() -> None:
    """Probe 14: with the reserve in whole units, each cell's share of a 1 cpu
    reserve (0.5) was rounded up to a whole vCPU: host (16 − 1) × 2 = 30 but
    cells 14 + 14. The cells share the host's whole-unit reserve exactly."""
    h = hv(overcommit={"cpu": 2}, reserved={"cpu": 1},
           status={"capacity": {"cpu": 16, "memory": "64Gi"},
                   "cells": [{"id": 0, "capacity": {"cpu": 8, "memory": "32Gi"}},
                             {"id": 1, "capacity": {"cpu": 8, "memory": "32Gi"}}]})
    out = cap.with_effective_capacity(h)
    assert out.status.effective_capacity[R("cpu")] == Quantity(30)
    assert [c.effective_capacity[R("cpu")] for c in out.status.cells] == [Quantity(15), Quantity(15)]
