"""Two API servers over one real etcd serve the same fleet: a write through one
shows in a watch on the other, and a claim through either sees the other's."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from tests.server.conftest import Api
from tests.server.objects import HV, RES, hypervisor, ready_host, reservation, status_of
from tests.server.watching import Watcher, names
from tests.support.etcd_local import EtcdCluster


def test_a_write_through_one_replica_shows_in_a_watch_on_the_other(
    make_api: Callable[..., Api], etcd_session: EtcdCluster
) -> None:
    url = etcd_session.url(prefix=f"/test-{uuid.uuid4().hex[:12]}")
    a, b = make_api(store_url=url), make_api(store_url=url)
    assert a.url != b.url
    a.client().post(HV, json=hypervisor("hv0"))
    rv = b.client().get(HV).json()["metadata"]["resourceVersion"]
    w = Watcher(b, {"resourceVersion": rv})
    a.client().post(HV, json=hypervisor("hv1"))
    a.client().patch(f"{HV}/hv0", {"spec": {"maintenance": "drain"}})
    w.wait_for(lambda ev: len(ev) >= 2, timeout=20)
    assert names(w.kinds()) == [("ADDED", "hv1"), ("MODIFIED", "hv0")]
    assert w.kinds()[1]["object"]["spec"]["maintenance"] == "drain"
    w.close()

    # Claims through either replica are checked against one state.
    ready_host(a, "hv2", cpu="4")
    assert a.client("sched-token").post(RES, json=reservation("r1", "3", host="hv2")).status_code == 201
    r = b.client("sched-token").post(RES, json=reservation("r2", "2", consumer="vm-2", host="hv2"))
    status_of(409, "Conflict", r.json())


def test_a_batch_of_one_revision_reaches_a_watch_whole(
    make_api: Callable[..., Api], etcd_session: EtcdCluster
) -> None:
    """On etcd an atomic batch is one revision for all its objects: every one of
    them is sent, and none twice."""
    api = make_api(store_url=etcd_session.url(prefix=f"/test-{uuid.uuid4().hex[:12]}"))
    c = api.client()
    rv = c.get(HV).json()["metadata"]["resourceVersion"]
    w = Watcher(api, {"resourceVersion": rv})
    r = c.post("/apis/hvfleet.io/v1/batch", json={"writes": [
        {"action": "create", "object": hypervisor(f"hv{i}")} for i in range(5)]})
    assert r.status_code == 200, r.text
    revisions = {o["metadata"]["resourceVersion"] for o in r.json()["items"]}
    assert len(revisions) == 1
    w.wait_for(lambda ev: len(ev) >= 5, timeout=20)
    # A later watch from before the batch (served from the fan-out's history) too.
    w2 = Watcher(api, {"resourceVersion": rv, "timeoutSeconds": "2"})
    assert w2.done.wait(15)
    for watcher in (w, w2):
        assert sorted(names(watcher.kinds())) == [("ADDED", f"hv{i}") for i in range(5)]
    w.close()
