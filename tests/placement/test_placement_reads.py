"""The Placement requests nova-compute and the scheduler make many of read no
whole fleet per request: after a warm-up, no store list (of any kind) is made
under a Placement request, on SQLite and on etcd; each answers from the
server's provider snapshot, patched per change. And a read right after a
write sees it, on the replica that wrote it and on another one over the same
store."""

from __future__ import annotations

import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from hvfleet.model.hypervisor import Reservation
from hvfleet.placement.records import read_fleet
from hvfleet.placement.snapshot import ProviderSnapshot
from hvfleet.server import threads
from hvfleet.server.dashboard.history import SAMPLER
from hvfleet.store import Store, open_store
from tests.placement.support import Placement, _fleet, _serve, _uuid
from tests.scheduling.sched_fleet import host, put_host
from tests.support import serve
from tests.support.etcd_local import EtcdCluster

# Frames of the Placement API (the core and its edge): a list made under one
# of them is a Placement request reading the store whole.
PLACEMENT_CODE = ("/hvfleet/placement/", "/hvfleet/server/placement/")


class ListCounter:
    """Counts the store's list calls made under Placement code (other server
    work, such as the readiness pass, lists too and is not counted)."""

    def __init__(self, store: Store) -> None:
        self.calls: list[str] = []
        self._lock = threading.Lock()
        real = store.list

        def counted(kind: str, *args: Any, **kwargs: Any) -> Any:
            if any(any(p in f.filename for p in PLACEMENT_CODE) for f in traceback.extract_stack()):
                with self._lock:
                    self.calls.append(kind)
            return real(kind, *args, **kwargs)

        store.list = counted  # type: ignore[method-assign]

    def take(self) -> list[str]:
        with self._lock:
            out, self.calls = self.calls, []
        return out


def _store_and_api(url: str, directory: Path) -> Iterator[tuple[Placement, ListCounter]]:
    store = open_store(url)
    counter = ListCounter(store)
    _fleet(store)
    yield from ((api, counter) for api in _serve(store, directory))
    store.close()


@pytest.fixture(scope="module")
def sqlite_served() -> Iterator[tuple[Placement, ListCounter]]:
    d = Path(tempfile.mkdtemp())
    yield from _store_and_api(f"sqlite:///{d}/hvfleet.db", d)


@pytest.fixture(scope="module")
def etcd_served(etcd_session: EtcdCluster) -> Iterator[tuple[Placement, ListCounter]]:
    d = Path(tempfile.mkdtemp())
    yield from _store_and_api(etcd_session.url(prefix=f"/reads-{uuid.uuid4().hex[:12]}"), d)


def _ok(r: Any, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def _requests(api: Placement) -> list[tuple[str, Callable[[], Any]]]:
    """nova-compute's and the scheduler's requests, each re-reading what it
    needs (generations move on with each write), over a stored provider with
    a child, traits, an aggregate and an allocation, and the hypervisor hv1
    (its agent's token reads and writes its own tree)."""
    rp, child, consumer, project = (str(uuid.uuid4()) for _ in range(4))
    agg = str(uuid.uuid4())
    _ok(api.call("PUT", "/traits/CUSTOM_READS"), 201)
    _ok(api.call("POST", "/resource_providers", body={"name": rp, "uuid": rp}))
    _ok(api.call("POST", "/resource_providers", body={"name": child, "uuid": child,
                                                       "parent_provider_uuid": rp}))
    _ok(api.call("PUT", f"/resource_providers/{rp}/inventories", body={
        "resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": 1000}}}))
    hv1 = _uuid(api.store, "hv1")

    def gen(u: str, role: str = "admin") -> int:
        return int(_ok(api.call("GET", f"/resource_providers/{u}", role))["generation"])

    def consumer_gen() -> int | None:
        return _ok(api.call("GET", f"/allocations/{consumer}")).get("consumer_generation")

    def put_allocation() -> None:
        _ok(api.call("PUT", f"/allocations/{consumer}", body={
            "allocations": {rp: {"resources": {"DISK_GB": 10}}, hv1: {"resources": {"VCPU": 1}}},
            "project_id": project, "user_id": "u", "consumer_generation": consumer_gen(),
            "consumer_type": "INSTANCE"}), 204)

    def put_inventories() -> None:
        _ok(api.call("PUT", f"/resource_providers/{rp}/inventories", body={
            "resource_provider_generation": gen(rp), "inventories": {"DISK_GB": {"total": 1000}}}))

    def put_traits(u: str = rp, role: str = "admin") -> None:
        _ok(api.call("PUT", f"/resource_providers/{u}/traits", role, {
            "resource_provider_generation": gen(u, role), "traits": ["CUSTOM_READS"]}))

    def put_aggregates() -> None:
        _ok(api.call("PUT", f"/resource_providers/{rp}/aggregates", body={
            "resource_provider_generation": gen(rp), "aggregates": [agg]}))

    def get(path: str, role: str = "admin") -> Callable[[], Any]:
        return lambda: _ok(api.call("GET", path, role))

    def reshape() -> None:
        _ok(api.call("POST", "/reshaper", body={
            "inventories": {rp: {"resource_provider_generation": gen(rp),
                                 "inventories": {"DISK_GB": {"total": 1000}}}},
            "allocations": {consumer: {
                "allocations": {rp: {"resources": {"DISK_GB": 10}}, hv1: {"resources": {"VCPU": 1}}},
                "project_id": project, "user_id": "u", "consumer_generation": consumer_gen(),
                "consumer_type": "INSTANCE"}}}), 204)

    def custom(kind: str) -> str:
        return f"CUSTOM_{kind}_{uuid.uuid4().hex.upper()}"

    def trait_made_and_deleted() -> None:
        name = custom("TRAIT")
        _ok(api.call("PUT", f"/traits/{name}"), 201)
        _ok(api.call("GET", f"/traits/{name}"), 204)
        _ok(api.call("DELETE", f"/traits/{name}"), 204)

    def class_made_renamed_and_deleted() -> None:
        name, renamed = custom("RC"), custom("RC")
        _ok(api.call("PUT", f"/resource_classes/{name}"), 201)
        _ok(api.call("GET", f"/resource_classes/{name}"))
        _ok(api.call("PUT", f"/resource_classes/{name}", body={"name": renamed}, version="1.6"))
        _ok(api.call("DELETE", f"/resource_classes/{renamed}"), 204)

    put_allocation()
    put_traits()
    put_aggregates()
    return [
        ("GET /resource_providers?name=", get(f"/resource_providers?name={rp}")),
        ("GET /resource_providers?uuid=", get(f"/resource_providers?uuid={rp}")),
        ("GET /resource_providers?in_tree=", get(f"/resource_providers?in_tree={child}")),
        ("GET /resource_providers?member_of=", get(f"/resource_providers?member_of={agg}")),
        ("GET /resource_providers?resources=", get("/resource_providers?resources=DISK_GB:1")),
        ("GET /resource_providers?required=", get("/resource_providers?required=CUSTOM_READS")),
        ("GET /resource_providers/{uuid}", get(f"/resource_providers/{rp}")),
        ("GET .../inventories", get(f"/resource_providers/{rp}/inventories")),
        ("GET .../inventories/{rc}", get(f"/resource_providers/{rp}/inventories/DISK_GB")),
        ("GET .../traits", get(f"/resource_providers/{rp}/traits")),
        ("GET .../aggregates", get(f"/resource_providers/{rp}/aggregates")),
        ("GET .../usages", get(f"/resource_providers/{rp}/usages")),
        ("GET .../allocations", get(f"/resource_providers/{rp}/allocations")),
        ("GET /usages?project_id=", get(f"/usages?project_id={project}")),
        ("GET /allocations/{consumer}", get(f"/allocations/{consumer}")),
        ("PUT /allocations/{consumer}", put_allocation),
        ("PUT .../inventories", put_inventories),
        ("PUT .../traits", put_traits),
        ("PUT .../aggregates", put_aggregates),
        ("an agent's GET of its own provider", get(f"/resource_providers/{hv1}", "agent")),
        ("an agent's PUT of its own traits", lambda: put_traits(hv1, "agent")),
        ("POST /reshaper", reshape),
        ("GET /traits", get("/traits?name=startswith:CUSTOM_")),
        ("GET /resource_classes", get("/resource_classes")),
        ("PUT, GET and DELETE /traits/{name}", trait_made_and_deleted),
        ("PUT, GET, rename and DELETE /resource_classes/{name}", class_made_renamed_and_deleted),
    ]


@pytest.mark.parametrize("served", ["sqlite_served", "etcd_served"])
def test_no_placement_request_lists_the_store_after_warm_up(
        served: str, request: pytest.FixtureRequest) -> None:
    api, counter = request.getfixturevalue(served)
    steps = _requests(api)
    for _, step in steps:  # warm-up: the snapshot's first load
        step()
    counter.take()
    listed = {}
    for name, step in steps:
        step()
        if kinds := counter.take():
            listed[name] = kinds
    assert listed == {}
    # The counter sees Placement's lists: a whole read is five (the store is wrapped).
    assert counter.take() == []
    read_fleet(api.store)
    assert sorted(counter.take()) == ["Hypervisor", "Lease", "OvercommitPolicy", "Reservation",
                                      "ResourceProvider"]


def _replicas(url: str) -> Iterator[tuple[Placement, Placement]]:
    """Two servers (replicas) over one store, each with its own store client."""
    da, db = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    first, second = open_store(url), open_store(url)
    _fleet(first)
    for a in _serve(first, da):
        for b in _serve(second, db, a.tokens):
            yield a, b
    first.close()
    second.close()


@pytest.fixture(scope="module")
def sqlite_replicas() -> Iterator[tuple[Placement, Placement]]:
    d = Path(tempfile.mkdtemp())
    yield from _replicas(f"sqlite:///{d}/hvfleet.db")


@pytest.fixture(scope="module")
def etcd_replicas(etcd_session: EtcdCluster) -> Iterator[tuple[Placement, Placement]]:
    yield from _replicas(etcd_session.url(prefix=f"/replicas-{uuid.uuid4().hex[:12]}"))


@pytest.mark.parametrize("replicas", ["sqlite_replicas", "etcd_replicas"])
def test_a_read_right_after_a_write_sees_it_on_the_same_and_the_other_replica(
        replicas: str, request: pytest.FixtureRequest) -> None:
    a, b = request.getfixturevalue(replicas)
    rp = str(uuid.uuid4())
    _ok(a.call("POST", "/resource_providers", body={"name": rp, "uuid": rp}))
    _ok(b.call("GET", f"/resource_providers/{rp}"))
    hv1 = _uuid(a.store, "hv1")
    consumer = str(uuid.uuid4())
    cgen = None
    for k in range(1, 9):
        writer, reader = (a, b) if k % 2 else (b, a)
        g = _ok(writer.call("GET", f"/resource_providers/{rp}"))["generation"]
        inv = _ok(writer.call("PUT", f"/resource_providers/{rp}/inventories", body={
            "resource_provider_generation": g, "inventories": {"DISK_GB": {"total": 100 + k}}}))
        for replica in (writer, reader):
            got = _ok(replica.call("GET", f"/resource_providers/{rp}/inventories"))
            assert got["inventories"]["DISK_GB"]["total"] == 100 + k
            assert got["resource_provider_generation"] == inv["resource_provider_generation"]
        _ok(writer.call("PUT", f"/allocations/{consumer}", body={
            "allocations": {rp: {"resources": {"DISK_GB": k}}, hv1: {"resources": {"VCPU": 1}}},
            "project_id": "p", "user_id": "u", "consumer_generation": cgen,
            "consumer_type": "INSTANCE"}), 204)
        for replica in (writer, reader):
            got = _ok(replica.call("GET", f"/allocations/{consumer}"))
            assert {u: x["resources"] for u, x in got["allocations"].items()} == {
                rp: {"DISK_GB": k}, hv1: {"VCPU": 1}}
            assert _ok(replica.call("GET", f"/resource_providers/{rp}/usages"))["usages"] == {"DISK_GB": k}
        cgen = got["consumer_generation"]
        _ok(writer.call("DELETE", f"/allocations/{consumer}"), 204)
        for replica in (writer, reader):
            assert _ok(replica.call("GET", f"/allocations/{consumer}"))["allocations"] == {}
            assert _ok(replica.call("GET", f"/resource_providers/{hv1}/usages"))["usages"].get("VCPU", 0) == 0
        cgen = None


def test_a_snapshot_loaded_from_the_store_answers_as_a_whole_read(
        sqlite_served: tuple[Placement, ListCounter]) -> None:
    """Loaded where a hypervisor has a record of its own (its traits), the
    snapshot shows the hypervisor's computed view, not the bare record."""
    api, _ = sqlite_served
    hv1 = _uuid(api.store, "hv1")
    _ok(api.call("PUT", "/traits/CUSTOM_LOADED"), 201)
    g = _ok(api.call("GET", f"/resource_providers/{hv1}"))["generation"]
    _ok(api.call("PUT", f"/resource_providers/{hv1}/traits", body={
        "resource_provider_generation": g, "traits": ["CUSTOM_LOADED"]}))
    snap = ProviderSnapshot.from_store(api.store)
    whole = read_fleet(api.store)
    assert snap.fleet().providers[hv1].inventories == whole.providers[hv1].inventories != {}
    assert dict(snap.fleet().providers) == dict(whole.providers)
    assert snap.graph().providers == whole.graph().providers


def test_a_reservation_stops_counting_when_it_expires_without_an_event(tmp_path: Path) -> None:
    """Nothing is written when a reservation's expiresAt passes: the snapshot
    looks at its hosts again at that time, so its views and graph drop the
    allocation as a whole read does."""
    store = open_store(f"sqlite:///{tmp_path}/hvfleet.db")
    _fleet(store)
    hv1 = _uuid(store, "hv1")
    expires = datetime.now(UTC) + timedelta(seconds=1.5)
    store.create(Reservation.model_validate({"metadata": {"name": "r-soon"}, "spec": {
        "hypervisor": "hv1", "resources": {"cpu": 2}, "consumer": "c-soon",
        "expires_at": expires.isoformat()}}), "test")
    snap = ProviderSnapshot.from_store(store)
    assert snap.fleet().allocations_of("c-soon") == {hv1: {"VCPU": 2}}
    assert snap.graph().providers[hv1].usages.get("VCPU") == 2
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
    snap.refresh(store)
    assert snap.fleet().allocations_of("c-soon") == {}
    assert snap.graph().providers[hv1].usages.get("VCPU", 0) == 0
    assert dict(snap.fleet().providers) == dict(read_fleet(store).providers)
    store.close()


def test_a_write_outside_the_objects_never_holds_up_the_next_placement_read_on_etcd(
        etcd_session: EtcdCluster, tmp_path: Path) -> None:
    """hvfleet writes beside its objects too (the history sampler's turn, renewed
    every 10 s, and the other server secrets): the store's revision moves on
    with no event the snapshot's follower is handed. A Placement GET right
    after such a write must not wait for a revision it will never see, and a
    read after an object write (by another client: another replica) still sees
    it, with such writes in between. So must a write of another fleet in the
    same etcd, under its own prefix (the store URL's default `?follow=all`).
    Through a real `hvfleet serve` on etcd."""
    url = etcd_session.url(prefix=f"/outside-{uuid.uuid4().hex[:12]}")
    other = open_store(url)  # another replica's client of the same store
    neighbour = open_store(etcd_session.url(prefix=f"/neighbour-{uuid.uuid4().hex[:12]}"))
    _fleet(other)
    srv = serve.start_server(tmp_path, url)
    try:
        headers = {"X-Auth-Token": srv.tokens["admin"], "OpenStack-API-Version": "placement 1.39",
                   "Accept": "application/json"}
        session = srv.session(None)

        def get(path: str) -> tuple[float, Any]:
            began = time.monotonic()
            r = session.get(f"{srv.url}/placement{path}", headers=headers, timeout=30)
            took = time.monotonic() - began
            assert r.status_code == 200, r.text
            return took, r.json()

        get("/resource_providers")  # warm-up: the snapshot loads and starts following
        took: list[float] = []
        for i in range(5):
            # The sampler's turn renewed (as its holder does every 10 s), a secret written.
            turn = other.server_secret(SAMPLER)
            assert turn is not None and other.put_server_secret(SAMPLER, turn[0], turn[1])
            assert other.put_server_secret(f"outside-{i}", b"x", None)
            put_host(neighbour, host(f"next-door{i}", {"cpu": 4, "memory": "8Gi"}, beat=datetime.now(UTC)))
            took.append(get("/resource_providers")[0])
            # A read right after an object write, past those writes, sees it.
            put_host(other, host(f"out{i}", {"cpu": 4, "memory": "8Gi"}, beat=datetime.now(UTC)))
            _, found = get(f"/resource_providers?name=out{i}")
            assert [p["name"] for p in found["resource_providers"]] == [f"out{i}"]
        took.sort()
        # Waiting for the unseen revision took FOLLOW_WAIT_S (0.5 s) each time.
        assert took[0] < 0.1 and took[2] < 0.25, took
    finally:
        serve.stop_server(srv)
        other.close()
        neighbour.close()


CANDIDATES = "/allocation_candidates?resources=VCPU:1,MEMORY_MB:512"


def _vcpu_used(doc: Any, rp: str) -> int:
    return int(doc["provider_summaries"][rp]["resources"]["VCPU"]["used"])


def test_a_warm_candidates_answer_follows_every_claim_on_either_replica(
        sqlite_replicas: tuple[Placement, Placement]) -> None:
    """Each replica answers a repeated candidates query from the body it
    keeps, on its event loop, while the store is unchanged; a claim made
    through the other replica (another store client over the same file), or
    written to the store directly, shows in the very next answer."""
    a, b = sqlite_replicas
    hv1 = _uuid(a.store, "hv1")
    for replica in (a, b):  # warm: the body is kept
        _ok(replica.call("GET", CANDIDATES))
    used = _vcpu_used(_ok(b.call("GET", CANDIDATES)), hv1)
    for k in range(1, 5):
        writer, reader = (a, b) if k % 2 else (b, a)
        consumer = str(uuid.uuid4())
        _ok(writer.call("PUT", f"/allocations/{consumer}", body={
            "allocations": {hv1: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u",
            "consumer_generation": None, "consumer_type": "INSTANCE"}), 204)
        for replica in (reader, writer, reader):
            assert _vcpu_used(_ok(replica.call("GET", CANDIDATES)), hv1) == used + k
    # A claim written to the store by another client (as `hvfleet reserve` makes one).
    writes = open_store(a.store.url)
    try:
        name = f"r-{uuid.uuid4().hex[:8]}"
        writes.create(Reservation.model_validate({"metadata": {"name": name}, "spec": {
            "hypervisor": "hv1", "resources": {"cpu": 2}, "consumer": f"c-{name}"}}), "test")
        for replica in (a, b):
            assert _vcpu_used(_ok(replica.call("GET", CANDIDATES)), hv1) == used + 4 + 2
    finally:
        writes.close()


def test_a_warm_candidates_answer_needs_no_worker_thread(
        sqlite_replicas: tuple[Placement, Placement]) -> None:
    """With every request worker thread busy, a repeated candidates query over
    an unchanged store is still answered (from the kept body, on the event
    loop); one that must catch up with a write waits for a worker."""
    a, _ = sqlite_replicas
    first = _ok(a.call("GET", CANDIDATES))
    release = threading.Event()
    busy = [threads._pool.submit(release.wait, 60) for _ in range(threads.WORKERS)]
    try:
        time.sleep(0.2)  # every worker has taken its task
        headers = {"X-Auth-Token": a.tokens["admin"], "OpenStack-API-Version": "placement 1.39"}
        got = requests.get(f"{a.url}/placement{CANDIDATES}", headers=headers, verify=str(a.ca), timeout=10)
        assert got.status_code == 200 and got.json() == first
    finally:
        release.set()
        for f in busy:
            f.result(timeout=10)
