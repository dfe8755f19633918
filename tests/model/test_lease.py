"""lease_live and renewal, the one rule for whether an agent's Lease proves it alive."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvfleet.model.lease import Lease, LeaseSpec, lease_live, released, renewed
from hvfleet.model.meta import ObjectMeta

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)


def lease(holder: str = "agent/hv1", renew: datetime | None = T0, duration: int = 30) -> Lease:
    return Lease(metadata=ObjectMeta(name="hv1"), spec=LeaseSpec(
        holder_identity=holder, renew_time=renew, lease_duration_seconds=duration))


@pytest.mark.parametrize(("case", "now", "live"), [
    (lease(), T0, True),
    (lease(), T0 + timedelta(seconds=29, microseconds=999_999), True),
    (lease(), T0 + timedelta(seconds=30), False),  # exactly one duration later: expired
    (lease(), T0 - timedelta(seconds=5), True),  # reader's clock a little behind
    (lease(duration=1), T0 + timedelta(seconds=2), False),
    (lease(holder=""), T0, False),  # released
    (lease(renew=None), T0, False),  # never renewed
])
def test_lease_live_table(case: Lease, now: datetime, live: bool) -> None:
    assert lease_live(case, now) is live


@given(st.integers(0, 10**6), st.integers(1, 3600), st.integers(-10**6, 10**7))
def test_live_exactly_while_younger_than_its_duration(renew_s: int, duration: int, age_ms: int) -> None:
    renew = T0 + timedelta(seconds=renew_s)
    now = renew + timedelta(milliseconds=age_ms)
    assert lease_live(lease(renew=renew, duration=duration), now) is (age_ms < duration * 1000)


def test_renewal_keeps_the_acquisition_and_a_comeback_counts_a_transition() -> None:
    first = renewed(None, "hv1", "agent/hv1", 30, T0)
    assert (first.spec.acquire_time, first.spec.renew_time, first.spec.lease_transitions) == (T0, T0, 0)
    again = renewed(first, "hv1", "agent/hv1", 30, T0 + timedelta(seconds=10))
    assert again.spec.acquire_time == T0 and again.spec.renew_time == T0 + timedelta(seconds=10)
    assert again.spec.lease_transitions == 0
    later = T0 + timedelta(minutes=5)  # expired in between: the agent comes back
    back = renewed(again, "hv1", "agent/hv1", 30, later)
    assert back.spec.acquire_time == later and back.spec.lease_transitions == 1
    gone = released(back)
    assert not lease_live(gone, later) and gone.spec.renew_time == later
    assert renewed(gone, "hv1", "agent/hv1", 30, later).spec.lease_transitions == 2
