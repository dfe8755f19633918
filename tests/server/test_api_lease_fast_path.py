"""A PUT whose stored object the etcd backend holds at the version it names (an
agent's Lease renewal: the version of its own last write) is made on the event
loop, its one etcd transaction awaited there (`resources.replace_on_loop`,
`EtcdStore.update_on_loop`), with no worker thread crossed. Everything
`replace` guarantees holds there too: the store's Lease rule (only the agent
it names writes it), compare-and-swap on resourceVersion, the audit line of
every write whatever its result, the watch event; and a request it cannot
serve (a dry run, a version not at hand) goes to the worker thread as before.

Real uvicorn in process over the session's real etcd; which path a write took
is told by the thread its audit line was recorded on."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hvfleet.model.lease import renewed
from hvfleet.server.identity import Action, Identity
from hvfleet.store.ownership import agent_manager
from tests.server.conftest import Api
from tests.server.static_auth import RecordingAudit
from tests.server.watching import Watcher
from tests.support.etcd_local import EtcdCluster

LEASES = "/apis/hvfleet.io/v1/leases"
AGENT = "agent-hv1-token"


class ThreadNotingAudit(RecordingAudit):
    """The records, and the name of the thread each was recorded on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def record(self, who: Identity | None, action: Action, *, before: str | None,
               after: str | None, code: int, reason: str) -> None:
        self.threads.append(threading.current_thread().name)
        super().record(who, action, before=before, after=after, code=code, reason=reason)


@pytest.fixture
def served(make_api: Callable[..., Api], etcd_session: EtcdCluster) -> tuple[Api, ThreadNotingAudit]:
    audit = ThreadNotingAudit()
    api = make_api(store_url=etcd_session.url(prefix=f"/test-{uuid.uuid4().hex[:12]}"), audit=audit)
    return api, audit


def lease_body(name: str, rv: str | None, at: datetime, holder: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"apiVersion": "hvfleet.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": holder or agent_manager(name), "leaseDurationSeconds": 30,
                     "renewTime": at.isoformat()}}


def on_loop(api: Api, thread: str) -> bool:
    return thread == api.server.thread.name


def test_a_renewal_at_the_version_it_last_wrote_is_made_on_the_loop_and_is_the_stored_object(
        served: tuple[Api, ThreadNotingAudit]) -> None:
    api, audit = served
    agent, start = api.client(AGENT), datetime.now(UTC)
    r = agent.post(LEASES, json=lease_body("hv1", None, start))
    assert r.status_code == 201, r.text
    rv = r.json()["metadata"]["resourceVersion"]
    w = Watcher(api, {"resourceVersion": rv}, path=LEASES)
    for i in range(1, 4):
        r = agent.put(f"{LEASES}/hv1", json=lease_body("hv1", rv, start + timedelta(seconds=10 * i)))
        assert r.status_code == 200, r.text
        assert int(r.json()["metadata"]["resourceVersion"]) > int(rv)
        rv = r.json()["metadata"]["resourceVersion"]
    # The answer is what the store holds, and what a watcher was sent.
    assert r.json() == api.store.get("Lease", "hv1").to_dict()
    w.wait_for(lambda ev: len(ev) >= 3, timeout=20)
    assert [e["object"]["metadata"]["resourceVersion"] for e in w.kinds()][-1] == rv
    w.close()
    # One audit line per write; the renewals' were recorded on the event loop's thread.
    assert [(a.action.verb, a.code) for a in audit.records] == [("create", 201)] + [("update", 200)] * 3
    assert audit.records[-1].after == rv
    assert [on_loop(api, t) for t in audit.threads] == [False, True, True, True]


def test_refusals_on_the_loop_write_nothing_and_are_audited(
        served: tuple[Api, ThreadNotingAudit]) -> None:
    """A Lease written by another than the agent it names (the store's rule,
    inside the write), a version that moved on (the compare-and-swap), and a
    malformed body: each a 4xx, nothing written, one audit line each."""
    api, audit = served
    agent, start = api.client(AGENT), datetime.now(UTC)
    first = agent.post(LEASES, json=lease_body("hv1", None, start)).json()["metadata"]["resourceVersion"]
    second = agent.put(f"{LEASES}/hv1", json=lease_body("hv1", first, start + timedelta(seconds=10)))
    assert second.status_code == 200, second.text
    rv = second.json()["metadata"]["resourceVersion"]
    # Another agent's Lease, created by that agent through the store.
    hv2 = api.store.create(renewed(None, "hv2", agent_manager("hv2"), 30, start), agent_manager("hv2"))
    stored = {n: api.store.get("Lease", n) for n in ("hv1", "hv2")}
    del audit.records[:], audit.threads[:]

    later = start + timedelta(seconds=20)
    by_ops = api.client("ops-token").put(f"{LEASES}/hv1", json=lease_body("hv1", rv, later))
    assert by_ops.status_code == 403, by_ops.text
    assert "written only by 'agent/hv1'" in by_ops.json()["message"]
    not_its_own = agent.put(f"{LEASES}/hv2", json=lease_body("hv2", hv2.metadata.resource_version, later))
    assert not_its_own.status_code == 403, not_its_own.text
    stale = agent.put(f"{LEASES}/hv1", json=lease_body("hv1", first, later))  # the version before the last
    assert stale.status_code == 409, stale.text
    assert stale.json()["reason"] == "Conflict"
    for body in (b'{"apiVersion": "hvfleet.io/v1", "kind": "Lease", "metadata": ', b"[]",
                 b'{"apiVersion": "hvfleet.io/v1", "kind": "Lease", "metadata": {"name": "hv1"}, '
                 b'"spec": {"leaseDurationSeconds": -5}}'):
        malformed = agent.put(f"{LEASES}/hv1", data=body, headers={"Content-Type": "application/json"})
        assert malformed.status_code in (400, 422), malformed.text
    assert {n: api.store.get("Lease", n) for n in ("hv1", "hv2")} == stored
    # The malformed bodies have their lines too (probe 14: every refused write is audited).
    assert [(a.action.name, a.code, a.before, a.after) for a in audit.records] == [
        ("hv1", 403, rv, None), ("hv2", 403, hv2.metadata.resource_version, None), ("hv1", 409, first, None),
        ("hv1", 400, None, None), ("hv1", 400, None, None), ("hv1", 422, None, None)]
    assert all(on_loop(api, t) for t in audit.threads)


def test_a_dry_run_is_made_in_a_worker_thread_and_writes_nothing(
        served: tuple[Api, ThreadNotingAudit]) -> None:
    api, audit = served
    agent, start = api.client(AGENT), datetime.now(UTC)
    rv = agent.post(LEASES, json=lease_body("hv1", None, start)).json()["metadata"]["resourceVersion"]
    r = agent.put(f"{LEASES}/hv1", params={"dryRun": "All"},
                  json=lease_body("hv1", rv, start + timedelta(seconds=10)))
    assert r.status_code == 200, r.text
    assert api.store.get("Lease", "hv1").metadata.resource_version == rv
    assert [on_loop(api, t) for t in audit.threads] == [False, False]
