"""What changes with the clock alone, with no write to announce it, is judged
by the served Placement API as `fit` and the claim judge it, through a real
`hvfleet serve` on SQLite and on etcd:

- an agent's Lease that lapses makes its host no candidate for Nova's
  query (`root_required=!COMPUTE_STATUS_DISABLED`), with
  `COMPUTE_STATUS_DISABLED` among its provider's traits, as `fit` refuses it;
  a renewal brings it back;
- a heartbeat that ages past the staleness (a host without a Lease) does the
  same;
- a reservation whose `expiresAt` passes stops counting in the candidates'
  summaries and in the provider's usages, equal to what `fit` finds free."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import requests

from hvfleet.model.hypervisor import Reservation
from hvfleet.model.readiness import DEFAULT_STALENESS
from hvfleet.store import open_store
from tests.placement.support import Placement, _serve, _served_sqlite, _uuid
from tests.scheduling.sched_fleet import host, put_host
from tests.support.etcd_local import EtcdCluster

NOVA = "root_required=!COMPUTE_STATUS_DISABLED"
DISABLED = "COMPUTE_STATUS_DISABLED"


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    yield from _served_sqlite(seeded=False)


@pytest.fixture(scope="module")
def etcd_api(etcd_session: EtcdCluster) -> Iterator[Placement]:
    d = Path(tempfile.mkdtemp())
    store = open_store(f"etcd://{etcd_session.endpoints[0].split('://')[-1]}",
                       prefix=f"/t-{uuid.uuid4().hex[:12]}")
    yield from _serve(store, d)
    store.close()


def _fit(api: Placement, cpu: int) -> dict[str, Any]:
    """`fit` through the same server (its warm fleet index)."""
    r = requests.post(f"{api.url}/apis/hvfleet.io/v1/fit", json={"resources": {"cpu": str(cpu)}, "why": True},
                      headers={"Authorization": f"Bearer {api.tokens['admin']}"}, verify=str(api.ca),
                      timeout=30)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _candidates(api: Placement, query: str) -> dict[str, Any]:
    r = api.call("GET", f"/allocation_candidates?{query}")
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _traits(api: Placement, uid: str) -> set[str]:
    r = api.call("GET", f"/resource_providers/{uid}/traits")
    assert r.status_code == 200, r.text
    return set(r.json()["traits"])


def _new_host(api: Placement, what: str, beat: datetime | None = None) -> tuple[str, str]:
    name = f"{what}-{uuid.uuid4().hex[:8]}"
    put_host(api.store, host(name, {"cpu": 8, "memory": "8Gi"}, beat=beat or datetime.now(UTC)))
    return name, _uuid(api.store, name)


def _sleep_until(t: datetime) -> None:
    time.sleep(max(0.0, (t - datetime.now(UTC)).total_seconds()) + 0.3)


def _judged_alike(api: Placement, name: str, uid: str, *, candidate: bool) -> None:
    """Nova's query, the provider's traits, the unfiltered query's summary and
    `fit` say the same of the host."""
    nova = _candidates(api, f"resources=VCPU:1&{NOVA}")
    assert (uid in nova["provider_summaries"]) is candidate
    assert (DISABLED not in _traits(api, uid)) is candidate
    plain = _candidates(api, "resources=VCPU:1")
    assert (DISABLED not in plain["provider_summaries"][uid]["traits"]) is candidate
    fit = _fit(api, 1)
    assert (name in [c["name"] for c in fit["candidates"]]) is candidate
    assert (name not in fit.get("rejected", {})) is candidate


@pytest.mark.parametrize("which", ["api", "etcd_api"])
def test_a_host_whose_agent_lease_lapses_without_a_write_is_no_candidate(
        which: str, request: pytest.FixtureRequest) -> None:
    api: Placement = request.getfixturevalue(which)
    name, uid = _new_host(api, "hv-lease")
    lease = api.store.keepalive(name, 2)
    _judged_alike(api, name, uid, candidate=True)
    assert lease.spec.renew_time is not None
    _sleep_until(lease.spec.renew_time + timedelta(seconds=2))
    # Nothing was written since: only the clock says the agent is gone.
    _judged_alike(api, name, uid, candidate=False)
    assert [r["reason"] for r in _fit(api, 1)["rejected"][name]] == ["agent-lease-expired"]
    api.store.keepalive(name, 60)  # the agent is back
    _judged_alike(api, name, uid, candidate=True)


@pytest.mark.parametrize("which", ["api", "etcd_api"])
def test_a_host_whose_heartbeat_ages_without_a_write_is_no_candidate(
        which: str, request: pytest.FixtureRequest) -> None:
    """No Lease: the heartbeat's age is judged, as fit judges it."""
    api: Placement = request.getfixturevalue(which)
    beat = datetime.now(UTC) - DEFAULT_STALENESS + timedelta(seconds=2)
    name, uid = _new_host(api, "hv-beat", beat)
    _judged_alike(api, name, uid, candidate=True)
    _sleep_until(beat + DEFAULT_STALENESS)
    _judged_alike(api, name, uid, candidate=False)
    assert [r["reason"] for r in _fit(api, 1)["rejected"][name]] == ["stale"]


def _free_cpu(api: Placement, name: str, uid: str) -> tuple[int, int, Fraction | None]:
    """The host's free VCPU as the candidates' summary and the provider's
    usages say it, and its free cpu as `fit` says it (None: not a candidate)."""
    summary = _candidates(api, "resources=VCPU:1")["provider_summaries"][uid]["resources"]["VCPU"]
    usages = api.call("GET", f"/resource_providers/{uid}/usages").json()["usages"]
    fit = {c["name"]: c for c in _fit(api, 1)["candidates"]}
    free = Fraction(fit[name]["free"]["cpu"]) if name in fit else None
    return summary["capacity"] - summary["used"], summary["capacity"] - usages["VCPU"], free


@pytest.mark.parametrize("which", ["api", "etcd_api"])
def test_a_reservation_that_expires_without_an_event_frees_its_space_in_candidates_and_usages(
        which: str, request: pytest.FixtureRequest) -> None:
    api: Placement = request.getfixturevalue(which)
    name, uid = _new_host(api, "hv-ttl")
    assert _free_cpu(api, name, uid) == (8, 8, 8)
    expires = datetime.now(UTC) + timedelta(seconds=2)
    api.store.create(Reservation.model_validate({"metadata": {"name": f"r-{name}"}, "spec": {
        "hypervisor": name, "resources": {"cpu": 6}, "consumer": str(uuid.uuid4()),
        "expires_at": expires.isoformat()}}), "test")
    assert _free_cpu(api, name, uid) == (2, 2, 2)
    whole = f"resources=VCPU:8&{NOVA}"
    assert uid not in _candidates(api, whole)["provider_summaries"]
    _sleep_until(expires)
    # No event since: the expiry alone gives the space back, everywhere alike.
    assert _free_cpu(api, name, uid) == (8, 8, 8)
    assert uid in _candidates(api, whole)["provider_summaries"]
    assert name in [c["name"] for c in _fit(api, 8)["candidates"]]
