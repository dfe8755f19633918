"""A Placement allocation keeps a claim's guarantees when the server dies
mid-write: the real `hvfleet serve` is killed with SIGKILL while 8 clients
PUT allocations across a hypervisor and a stored provider; after a restart
over the same store, every acknowledged allocation is there, every write is
whole (a claim with its record's allocation and its consumer record, or
none of them), nothing is overbooked, and the fleet fills to exactly its
capacity. On SQLite and on etcd."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from hvfleet.store import open_store
from tests.scheduling.sched_fleet import host, put_host
from tests.support.etcd_local import EtcdCluster
from tests.support.serve import Server, start_server, stop_server

CAPACITY = 24
HOST = "hv-kill"


@pytest.fixture(params=["sqlite", "etcd"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/hvfleet.db"
    else:
        etcd: EtcdCluster = request.getfixturevalue("etcd_session")
        yield f"etcd://{etcd.endpoints[0].split('://')[-1]}?prefix=/kill-{uuid.uuid4().hex[:12]}"


def _call(srv: Server, method: str, path: str, body: Any = None) -> requests.Response:
    return requests.request(method, f"{srv.url}/placement{path}", verify=str(srv.ca), timeout=30,
                            data=None if body is None else json.dumps(body), headers={
                                "X-Auth-Token": srv.tokens["admin"], "Content-Type": "application/json",
                                "OpenStack-API-Version": "placement 1.39", "Accept": "application/json"})


def _race(srv: Server, hv: str, sp: str, won: list[str], stop_after: int | None) -> None:
    """8 clients allocate 1 VCPU on the hypervisor and 1 DISK_GB on the
    stored provider per new consumer until the fleet is full or the server is
    gone; `won` gets each consumer the server acknowledged (204). With
    `stop_after`, the server is killed (SIGKILL) once that many succeeded."""
    lock = threading.Lock()
    full = threading.Event()

    def client() -> None:
        while not full.is_set():
            consumer = str(uuid.uuid4())
            body = {"allocations": {hv: {"resources": {"VCPU": 1}}, sp: {"resources": {"DISK_GB": 1}}},
                    "project_id": "p", "user_id": "u", "consumer_generation": None,
                    "consumer_type": "INSTANCE"}
            try:
                r = _call(srv, "PUT", f"/allocations/{consumer}", body)
            except requests.RequestException:
                full.set()  # the server is gone
                return
            if r.status_code == 204:
                with lock:
                    won.append(consumer)
                    if stop_after is not None and len(won) == stop_after:
                        srv.process.kill()
            elif "exceed the capacity" in r.text:
                full.set()
            else:
                assert r.status_code == 409, r.text  # a lost race: Nova retries

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_a_server_killed_during_placement_claims_loses_no_acknowledged_one_and_overbooks_nothing(
        store_url: str, tmp_path: Path) -> None:
    with open_store(store_url) as store:
        put_host(store, host(HOST, {"cpu": CAPACITY, "memory": "8Gi"}, beat=datetime.now(UTC)))
        hv = store.get_hypervisor(HOST).metadata.uid
    srv = start_server(tmp_path / "a", store_url)
    sp = str(uuid.uuid4())
    assert _call(srv, "POST", "/resource_providers", {"name": sp, "uuid": sp}).status_code == 200
    inventory = {"resource_provider_generation": 0, "inventories": {"DISK_GB": {"total": CAPACITY}}}
    assert _call(srv, "PUT", f"/resource_providers/{sp}/inventories", inventory).status_code == 200
    won: list[str] = []
    try:
        _race(srv, hv, sp, won, stop_after=6)
        assert srv.process.wait(10) == -9
    finally:
        if srv.process.poll() is None:
            stop_server(srv)

    def consistent() -> set[str]:
        """The consumers with a claim on the host, once each write is checked whole."""
        with open_store(store_url) as store:
            claims = [r for r in store.list_reservations() if r.spec.hypervisor == HOST]
            record = store.get("ResourceProvider", sp)
            consumers = {c.metadata.name for c in store.list("PlacementConsumer").items}
        claimed = {r.spec.consumer for r in claims}
        assert len(claims) == len(claimed) <= CAPACITY
        assert claimed == set(record.spec.allocations) == consumers  # type: ignore[attr-defined]
        return claimed

    killed = consistent()
    assert set(won) <= killed and len(won) >= 6  # acknowledged means written
    again = start_server(tmp_path / "b", store_url, tokens=srv.tokens)
    try:
        more: list[str] = []
        _race(again, hv, sp, more, stop_after=None)
        assert consistent() == killed | set(more)
        assert len(killed | set(more)) == CAPACITY
        usages = _call(again, "GET", f"/resource_providers/{hv}/usages").json()["usages"]
        assert usages["VCPU"] == CAPACITY
        assert _call(again, "GET", f"/resource_providers/{sp}/usages").json()["usages"] == {
            "DISK_GB": CAPACITY}
    finally:
        stop_server(again)
