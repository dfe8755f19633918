"""Lease renewals through any replica: an agent's renewal names the version of
its last one, which may have gone through another replica (a load balancer
spreading requests, a failover). Every replica follows every write through
its process's one etcd feed, which keeps the stored bytes of the Leases and
Hypervisors it follows (`EtcdStore`'s `FollowedValues`), so the replica the
renewal reaches has that version at hand and makes the write on its event
loop with no read first (`resources.replace_on_loop`), however many other
writes came in between; the compare-and-swap in the etcd transaction still
refuses a version that moved on (409 Conflict).

Two real uvicorn servers in process over the session's real etcd, each with
its own store (and feed); which path a write took is told by the thread its
audit line was recorded on, as in test_api_lease_fast_path."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from hvfleet.model.hypervisor import OvercommitPolicy, OvercommitPolicySpec
from hvfleet.model.meta import ObjectMeta
from hvfleet.store import etcd as etcd_backend
from hvfleet.store.base import Write
from tests.server.running import Api
from tests.server.test_api_lease_fast_path import AGENT, LEASES, ThreadNotingAudit, lease_body, on_loop
from tests.server.watching import Watcher
from tests.support.etcd_local import EtcdCluster

POLICIES = "/apis/hvfleet.io/v1/overcommitpolicies"


def _replicas(make_api: Callable[..., Api], etcd: EtcdCluster) -> list[tuple[Api, ThreadNotingAudit]]:
    url = etcd.url(prefix=f"/test-{uuid.uuid4().hex[:12]}")
    out = []
    for _ in range(2):
        audit = ThreadNotingAudit()
        out.append((make_api(store_url=url, audit=audit), audit))
    return out


def _other_writes(api: Api, count: int, followers: list[Api]) -> None:
    """`count` writes of objects no renewal touches (OvercommitPolicies that
    select nothing), in batches: what the rest of a large fleet writes
    meanwhile; returns once each of `followers` has followed the last one."""
    tag = uuid.uuid4().hex[:8]
    since = str(api.store.revision())
    watchers = [Watcher(f, {"resourceVersion": since}, path=POLICIES) for f in followers]
    for start in range(0, count, 100):
        api.store.write_all([
            Write("create", OvercommitPolicy(
                metadata=ObjectMeta(name=f"other-{tag}-{i}"),
                spec=OvercommitPolicySpec(selector={"matchLabels": {"none": tag}}, overcommit={"cpu": 2})))
            for i in range(start, min(count, start + 100))], "test")
    last = f"other-{tag}-{count - 1}"
    for w in watchers:
        w.wait_for(lambda ev: last in [e["object"]["metadata"]["name"] for e in ev], timeout=60)
        w.close()


def test_renewals_alternating_between_replicas_are_each_made_on_the_loop_with_no_read(
        make_api: Callable[..., Api], etcd_session: EtcdCluster) -> None:
    """Each renewal goes through the replica the last one did not, with more
    other writes in between than a replica keeps decoded: every one is made on
    the event loop of the replica it reached (the version it names is at hand
    there, from the bytes that replica followed) and answers the stored object."""
    (a, audit_a), (b, audit_b) = _replicas(make_api, etcd_session)
    start = datetime.now(UTC)
    # From before the create: the first renewal's replica must have followed the create too.
    since = str(a.store.revision())
    created = a.client(AGENT).post(LEASES, json=lease_body("hv1", None, start))
    assert created.status_code == 201, created.text
    rv = created.json()["metadata"]["resourceVersion"]
    watchers = [Watcher(api, {"resourceVersion": since}, path=LEASES) for api in (a, b)]
    written = [rv]
    for i in range(1, 7):
        via = (a, b)[i % 2]
        # The replica has followed the last write of the Lease (its Lease watch,
        # fed by the same feed, saw it), the create included: a renewal reaching
        # a replica whose feed has not read that write yet (it reads at a pace)
        # takes the worker thread, as it should.
        watchers[i % 2].wait_for(lambda ev, rv=rv: rv in [e["object"]["metadata"]["resourceVersion"]
                                                          for e in ev])
        if i in (3, 4):
            _other_writes(a, etcd_backend.WATCH_DECODED_KEPT + 200, [a, b])
        r = via.client(AGENT).put(f"{LEASES}/hv1",
                                  json=lease_body("hv1", rv, start + timedelta(seconds=10 * i)))
        assert r.status_code == 200, r.text
        rv = r.json()["metadata"]["resourceVersion"]
        written.append(rv)
        assert r.json() == via.store.get("Lease", "hv1").to_dict()
    for w in watchers:
        w.close()
    assert [(x.action.verb, x.code) for x in audit_a.records] == [("create", 201)] + [("update", 200)] * 3
    assert [(x.action.verb, x.code) for x in audit_b.records] == [("update", 200)] * 3
    # The create took the worker thread; every renewal, on either replica, the loop.
    assert [on_loop(a, t) for t in audit_a.threads] == [False, True, True, True]
    assert [on_loop(b, t) for t in audit_b.threads] == [True, True, True]


def test_a_stale_renewal_through_the_other_replica_is_a_conflict(
        make_api: Callable[..., Api], etcd_session: EtcdCluster) -> None:
    """A renewal naming a version that moved on (another renewal won through
    the other replica) is 409 Conflict on whichever replica it reaches, and
    writes nothing; the audit line says so."""
    (a, audit_a), (b, audit_b) = _replicas(make_api, etcd_session)
    start = datetime.now(UTC)
    created = a.client(AGENT).post(LEASES, json=lease_body("hv1", None, start))
    first = created.json()["metadata"]["resourceVersion"]
    won = b.client(AGENT).put(f"{LEASES}/hv1", json=lease_body("hv1", first, start + timedelta(seconds=10)))
    assert won.status_code == 200, won.text
    for via, audit in ((a, audit_a), (b, audit_b)):
        late = via.client(AGENT).put(f"{LEASES}/hv1",
                                     json=lease_body("hv1", first, start + timedelta(seconds=20)))
        assert late.status_code == 409, late.text
        assert late.json()["reason"] == "Conflict"
        line = audit.records[-1]
        # `before` is the version the refusal was judged at: the named one when
        # the replica held it (the write tried on the loop), else the stored
        # one it read (the write tried in a thread). Nothing was written.
        assert (line.code, line.after) == (409, None)
        assert line.before in (first, won.json()["metadata"]["resourceVersion"])
    assert a.store.get("Lease", "hv1").to_dict() == won.json()
