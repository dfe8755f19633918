"""Watch with a label selector follows kube-apiserver's watch cache: an object
modified so that it leaves the selection is sent as DELETED (its previous
content, at the event's resourceVersion), one that enters it as ADDED, one
that matches before and after as MODIFIED, and one that matches neither is not
sent. The same holds for a watch that starts from a resourceVersion older
than the server (a new server over the same store, catching up from the
store's history, SQLite compacted or etcd), for Table watches, for the
kubernetes Python client and for kubectl."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from hvfleet.store import sqlite as sqlite_backend
from tests.server.clients import GROUP, PLURAL, VERSION, Kubectl, api_client
from tests.server.conftest import Api
from tests.server.objects import HV, TABLE, hypervisor
from tests.server.watching import Watcher, names
from tests.support.etcd_local import EtcdCluster
from tests.support.kubectl import KUBECTLS


def relabel(api: Api, name: str, rack: str) -> None:
    r = api.client().patch(f"{HV}/{name}", {"metadata": {"labels": {"rack": rack}}})
    assert r.status_code == 200, r.text


def drain(api: Api, name: str) -> None:
    r = api.client().patch(f"{HV}/{name}", {"spec": {"maintenance": "drain"}})
    assert r.status_code == 200, r.text


def create(api: Api, name: str, rack: str) -> None:
    doc = hypervisor(name)
    doc["metadata"]["labels"] = {"rack": rack}
    r = api.client().post(HV, json=doc)
    assert r.status_code == 201, r.text


def transitions(api: Api) -> None:
    """hv-out leaves rack=a, hv-in enters it, hv-stay stays in it, hv-never is
    never in it; then hv-out (now outside) and hv-stay are deleted."""
    relabel(api, "hv-out", "b")
    relabel(api, "hv-in", "a")
    drain(api, "hv-stay")
    drain(api, "hv-never")
    drain(api, "hv-out")
    assert api.client().delete(f"{HV}/hv-out").status_code == 200
    assert api.client().delete(f"{HV}/hv-stay").status_code == 200


EXPECTED = [("DELETED", "hv-out"), ("ADDED", "hv-in"), ("MODIFIED", "hv-stay"),
            ("DELETED", "hv-stay")]


def setup_fleet(api: Api) -> str:
    for name, rack in (("hv-out", "a"), ("hv-in", "b"), ("hv-stay", "a"), ("hv-never", "b")):
        create(api, name, rack)
    rv: str = api.client().get(HV).json()["metadata"]["resourceVersion"]
    return rv


def check_leaving_event(events: list[dict[str, Any]], api: Api) -> None:
    """The DELETED of an object leaving the selection carries its previous
    content (the labels it matched with) at the revision of the write that
    made it leave, as kube-apiserver sends it."""
    leaving = events[0]["object"]
    assert leaving["metadata"]["labels"] == {"rack": "a"}
    relabelled_at = int(events[1]["object"]["metadata"]["resourceVersion"]) - 1
    assert int(leaving["metadata"]["resourceVersion"]) == relabelled_at


def test_objects_entering_and_leaving_a_selection_are_added_and_deleted(api: Api) -> None:
    rv = setup_fleet(api)
    w = Watcher(api, {"resourceVersion": rv, "labelSelector": "rack=a"})
    transitions(api)
    w.wait_for(lambda ev: len(names(ev)) >= 4)
    time.sleep(0.3)  # nothing else may follow
    assert names(w.kinds()) == EXPECTED
    check_leaving_event(w.kinds(), api)
    w.close()


def test_a_watch_without_version_then_leaving_the_selection(api: Api) -> None:
    setup_fleet(api)
    w = Watcher(api, {"labelSelector": "rack=a"})
    w.wait_for(lambda ev: len(names(ev)) >= 2)
    transitions(api)
    w.wait_for(lambda ev: len(names(ev)) >= 6)
    time.sleep(0.3)
    assert names(w.kinds()) == [("ADDED", "hv-out"), ("ADDED", "hv-stay"), *EXPECTED]
    w.close()


def test_a_name_only_watch_still_sees_every_change_of_its_object(api: Api) -> None:
    setup_fleet(api)
    w = Watcher(api, {"fieldSelector": "metadata.name=hv-out"})
    relabel(api, "hv-out", "b")
    drain(api, "hv-out")
    w.wait_for(lambda ev: len(names(ev)) >= 3)
    assert names(w.kinds()) == [("ADDED", "hv-out"), ("MODIFIED", "hv-out"), ("MODIFIED", "hv-out")]
    w.close()


def test_a_watch_from_before_the_server_started_catches_up_with_the_same_events(
    make_api: Callable[..., Api], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new server over the same SQLite file knows nothing of the states at the
    watch's resourceVersion: they come from the store's history, which keeps
    each object's last write below the compaction floor (here hv-in's and
    hv-never's creation), so entering and never-matching are still told apart."""
    monkeypatch.setattr(sqlite_backend, "EVENT_HISTORY", 8)
    monkeypatch.setattr(sqlite_backend, "_COMPACT_EVERY", 2)
    first = make_api()
    rv = setup_fleet(first)
    for i in range(6):  # other writes, so the fleet's creation falls below the floor
        create(first, f"filler{i}", "c")
    rv = first.client().get(HV).json()["metadata"]["resourceVersion"]
    transitions(first)
    with sqlite3.connect(str(first.store.url).removeprefix("sqlite:///")) as db:
        floor = db.execute("SELECT value FROM meta WHERE key = 'compacted'").fetchone()[0]
    assert 4 <= floor <= int(rv)  # the fleet's creations are below the floor, rv is not
    second = make_api()  # a fresh fan-out: its history starts now
    w = Watcher(second, {"resourceVersion": rv, "labelSelector": "rack=a", "timeoutSeconds": "2"})
    assert w.done.wait(30)
    assert names(w.kinds()) == EXPECTED
    check_leaving_event(w.kinds(), second)


def test_the_same_over_etcd_live_and_catching_up(
    make_api: Callable[..., Api], etcd_session: EtcdCluster
) -> None:
    url = etcd_session.url(prefix=f"/test-{uuid.uuid4().hex[:12]}")
    api = make_api(store_url=url)
    rv = setup_fleet(api)
    live = Watcher(api, {"resourceVersion": rv, "labelSelector": "rack=a"})
    transitions(api)
    live.wait_for(lambda ev: len(names(ev)) >= 4)
    replica = make_api(store_url=url)
    caught_up = Watcher(replica, {"resourceVersion": rv, "labelSelector": "rack=a",
                                  "timeoutSeconds": "2"})
    assert caught_up.done.wait(30)
    time.sleep(0.3)
    for w in (live, caught_up):
        assert names(w.kinds()) == EXPECTED
        check_leaving_event(w.kinds(), api)
    live.close()


def test_table_watch_sends_a_deleted_row_for_an_object_leaving_the_selection(api: Api) -> None:
    rv = setup_fleet(api)
    w = Watcher(api, {"resourceVersion": rv, "labelSelector": "rack=a"}, headers={"Accept": TABLE})
    transitions(api)
    w.wait_for(lambda ev: len(ev) >= 4)
    time.sleep(0.3)
    got = [(e["type"], e["object"]["rows"][0]["cells"][0]) for e in w.kinds()]
    assert got == EXPECTED
    assert all(e["object"]["kind"] == "Table" for e in w.kinds())
    w.close()


def test_kubernetes_client_watch_with_a_label_selector(make_api: Callable[..., Api],
                                                        tmp_path: Path) -> None:
    api = make_api(tls=True)
    rv = setup_fleet(api)
    objects = k8s.CustomObjectsApi(api_client(api, tmp_path))
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        for event in w.stream(objects.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                              label_selector="rack=a", resource_version=rv, timeout_seconds=30):
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if len(seen) >= 4:
                w.stop()
        done.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    transitions(api)
    assert done.wait(45)
    assert seen == EXPECTED


@pytest.mark.parametrize("version", sorted(KUBECTLS))
def test_kubectl_get_watch_with_a_label_selector(make_api: Callable[..., Api], tmp_path: Path,
                                                 version: str) -> None:
    kubectl = Kubectl(KUBECTLS[version], version, make_api(tls=True), tmp_path)
    setup_fleet(kubectl.api)
    proc = subprocess.Popen(kubectl.argv("viewer-token", "get", "hv", "-l", "rack=a", "-w",
                                         "--output-watch-events", "--no-headers"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HOME": str(tmp_path)})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()

    def events() -> list[tuple[str, str]]:
        return [(p[0], p[1]) for p in (line.split() for line in lines) if len(p) >= 2]

    try:
        deadline = time.monotonic() + 60
        while len(events()) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, (lines, proc.poll())
            time.sleep(0.05)
        transitions(kubectl.api)
        while len(events()) < 6:
            assert time.monotonic() < deadline, lines
            time.sleep(0.05)
        time.sleep(0.3)
        assert sorted(events()[:2]) == [("ADDED", "hv-out"), ("ADDED", "hv-stay")]
        assert events()[2:] == EXPECTED
    finally:
        proc.terminate()
        proc.wait(timeout=10)
