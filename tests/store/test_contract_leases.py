"""Agent liveness as Lease objects, on every backend (see conftest.STORE_BACKENDS)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from hvfleet.model import Forbidden, Hypervisor, InvalidInput
from hvfleet.model.lease import Lease, LeaseSpec
from hvfleet.model.meta import ObjectMeta
from hvfleet.store import Store, open_store

MakeHv = Callable[..., Hypervisor]


def test_keepalive_renews_a_small_lease_and_never_touches_status(
    store: Store, make_hypervisor: MakeHv
) -> None:
    host = store.create(make_hypervisor("hv1"), "agent/hv1")
    first = store.keepalive("hv1", 30)
    assert isinstance(first, Lease)
    assert first.spec.holder_identity == "agent/hv1"
    assert first.spec.lease_duration_seconds == 30
    assert first.spec.renew_time is not None
    assert abs((datetime.now(UTC) - first.spec.renew_time).total_seconds()) < 5
    second = store.keepalive("hv1", 30)
    assert second.spec.renew_time is not None and second.spec.renew_time > first.spec.renew_time
    assert second.spec.acquire_time == first.spec.acquire_time
    assert store.get("Lease", "hv1") == second
    assert store.get("Hypervisor", "hv1") == host  # status not rewritten
    assert store.agent_liveness() == {"hv1": True}
    assert list(store.agent_leases()) == ["hv1"]
    # kubectl-style names work for the kind too.
    assert [o.metadata.name for o in store.list("leases").items] == ["hv1"]


def test_a_lease_not_renewed_expires_and_a_release_ends_it_at_once(store: Store) -> None:
    lease = store.keepalive("hv1", 1)
    store.keepalive("hv2", 60)
    assert lease.spec.renew_time is not None
    later = lease.spec.renew_time + timedelta(seconds=1)
    assert store.agent_liveness(now=later) == {"hv1": False, "hv2": True}
    deadline = time.monotonic() + 5
    while store.agent_liveness()["hv1"]:
        assert time.monotonic() < deadline, "a lease one second old still shows live"
        time.sleep(0.1)
    back = store.keepalive("hv1", 60)  # the agent is back
    assert back.spec.lease_transitions == 1
    assert store.agent_liveness() == {"hv1": True, "hv2": True}
    store.release("hv2")
    assert store.agent_liveness() == {"hv1": True, "hv2": False}
    store.release("never-had-one")  # nothing to let go of
    with pytest.raises(InvalidInput, match="leaseDurationSeconds"):
        store.keepalive("hv1", 0)


def _lease(name: str, holder: str) -> Lease:
    return Lease(metadata=ObjectMeta(name=name), spec=LeaseSpec(
        holder_identity=holder, lease_duration_seconds=30, renew_time=datetime.now(UTC)))


def test_only_the_hosts_agent_writes_its_lease(store: Store) -> None:
    for manager in ("operator", "agent/hv2", "scheduler"):
        with pytest.raises(Forbidden, match="written only by 'agent/hv1'"):
            store.create(_lease("hv1", "agent/hv1"), manager)
    with pytest.raises(InvalidInput, match="holderIdentity"):
        store.create(_lease("hv1", "agent/hv2"), "agent/hv1")
    assert store.list("Lease").items == []
    held = store.keepalive("hv1", 30)
    renewed = held.model_copy(update={"spec": held.spec.model_copy(
        update={"renew_time": datetime.now(UTC)})})
    for manager in ("operator", "agent/hv2"):
        with pytest.raises(Forbidden):
            store.update(renewed, manager)
    assert store.get("Lease", "hv1") == held


def _renew(url: str, name: str, n: int, errors: list[BaseException]) -> None:
    s = open_store(url)
    try:
        for _ in range(n):
            s.keepalive(name, 30)
    except BaseException as exc:
        errors.append(exc)
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_two_stores_of_one_agent_renew_without_errors(store: Store, store_url: str) -> None:
    # A restarted agent may overlap with its old process for a moment.
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_renew, args=(store_url, "hv1", 20, errors)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store.agent_liveness() == {"hv1": True}
