"""Watch-list (`sendInitialEvents=true&resourceVersionMatch=NotOlderThan`), as
kube-apiserver serves it: the current objects as ADDED, then a BOOKMARK
annotated `k8s.io/initial-events-end` at their version, then changes; and the
ListOptions checks and the 504 "Too large resource version" around it. The
client that needs it is a current kubectl's `wait`, which lists through a
watch-list and never finishes without the bookmark."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.server.clients import Kubectl
from tests.server.conftest import Api
from tests.server.objects import HV, TABLE, hypervisor, status_of
from tests.server.watching import Watcher, names
from tests.support.kubectl import KUBECTLS

WATCH_LIST = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
              "allowWatchBookmarks": "true"}


def _initial_end(event: dict[str, Any]) -> bool:
    annotations = event["object"]["metadata"].get("annotations") or {}
    return event["type"] == "BOOKMARK" and annotations.get("k8s.io/initial-events-end") == "true"


def test_watch_list_sends_the_state_then_the_initial_events_end_bookmark_then_changes(api: Api) -> None:
    c = api.client()
    for n in ("hv0", "hv1"):
        assert c.post(HV, json=hypervisor(n)).status_code == 201
    listed_rv = int(c.get(HV).json()["metadata"]["resourceVersion"])
    w = Watcher(api, WATCH_LIST)
    assert w.status == 200
    w.wait_for(lambda ev: any(_initial_end(e) for e in ev))
    c.post(HV, json=hypervisor("hv2"))
    w.wait_for(lambda ev: ("ADDED", "hv2") in names(ev))
    events = w.kinds()
    end = next(i for i, e in enumerate(events) if _initial_end(e))
    assert sorted(names(events[:end])) == [("ADDED", "hv0"), ("ADDED", "hv1")]
    assert int(events[end]["object"]["metadata"]["resourceVersion"]) == listed_rv
    assert events[end]["object"]["kind"] == "Hypervisor"
    assert names(events[end + 1:]) == [("ADDED", "hv2")]
    assert int(events[-1]["object"]["metadata"]["resourceVersion"]) > listed_rv
    w.close()


def test_watch_list_from_a_version_and_with_a_selector(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor("hv0"))
    other = hypervisor("hv1")
    other["metadata"]["labels"] = {"rack": "b"}
    c.post(HV, json=other)
    rv = c.get(HV).json()["metadata"]["resourceVersion"]
    # NotOlderThan an existing version: the state now (at least that new).
    w = Watcher(api, {**WATCH_LIST, "resourceVersion": rv, "labelSelector": "rack=b"})
    w.wait_for(lambda ev: any(_initial_end(e) for e in ev))
    assert names(w.kinds()) == [("ADDED", "hv1")]
    w.close()


def test_watch_list_bookmark_ends_the_initial_rows_of_a_table_watch(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor("hv0"))
    w = Watcher(api, WATCH_LIST, headers={"Accept": TABLE})
    w.wait_for(lambda ev: any(_initial_end(e) for e in ev))
    first = w.kinds()[0]
    assert first["type"] == "ADDED" and first["object"]["kind"] == "Table"
    assert first["object"]["rows"][0]["cells"][0] == "hv0"
    w.close()


def test_without_initial_events_a_watch_from_now_sends_only_changes(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor("hv0"))
    w = Watcher(api, {**WATCH_LIST, "sendInitialEvents": "false"})
    c.post(HV, json=hypervisor("hv1"))
    w.wait_for(lambda ev: len(names(ev)) >= 1)
    assert names(w.kinds()) == [("ADDED", "hv1")]
    assert not any(_initial_end(e) for e in w.kinds())
    w.close()


def test_watch_list_options_are_checked_as_kube_apiserver_checks_them(api: Api) -> None:
    c = api.client()
    cases = {
        # sendInitialEvents needs resourceVersionMatch=NotOlderThan ...
        "watch=true&sendInitialEvents=true&allowWatchBookmarks=true": "resourceVersionMatch",
        # ... and bookmarks, which carry its end.
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan": "allowWatchBookmarks",
        # A match without sendInitialEvents, or one a watch does not know.
        "watch=true&resourceVersionMatch=NotOlderThan": "resourceVersionMatch",
        "watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=Exact":
            "resourceVersionMatch",
        # A list never sends initial events.
        "sendInitialEvents=true": "sendInitialEvents",
        "resourceVersionMatch=NotOlderThan": "resourceVersionMatch",
        "resourceVersion=1&resourceVersionMatch=Newest": "resourceVersionMatch",
        "resourceVersion=0&resourceVersionMatch=Exact": "resourceVersionMatch",
    }
    for query, field in cases.items():
        r = c.get(f"{HV}?{query}")
        status_of(422, "Invalid", r.json())
        assert {cause["field"] for cause in r.json()["details"]["causes"]} == {field}, query
        assert r.json()["message"].startswith('ListOptions.meta.k8s.io "" is invalid: '), r.text
    status_of(400, "BadRequest", c.get(f"{HV}?{'watch=true&'}sendInitialEvents=maybe").json())


def test_a_version_past_the_newest_is_504_too_large_resource_version(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor("hv0"))
    newest = api.store.revision()
    for query in (f"resourceVersion={newest + 100}",
                  f"watch=true&resourceVersion={newest + 100}",
                  f"watch=true&resourceVersion={newest + 100}&sendInitialEvents=true"
                  "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"):
        r = c.get(f"{HV}?{query}")
        status_of(504, "Timeout", r.json())
        body = r.json()
        assert body["message"] == f"Timeout: Too large resource version: {newest + 100}, current: {newest}"
        assert body["details"]["retryAfterSeconds"] == 1
        assert body["details"]["causes"] == [{"reason": "ResourceVersionTooLarge",
                                              "message": "Too large resource version"}]
    # A get too.
    r = c.get(f"{HV}/hv0?resourceVersion={newest + 100}")
    status_of(504, "Timeout", r.json())
    assert r.json()["details"]["retryAfterSeconds"] == 1
    # The newest itself is fine.
    assert c.get(f"{HV}?resourceVersion={newest}").status_code == 200
    assert c.get(f"{HV}/hv0?resourceVersion={newest}").status_code == 200


def _ready(api: Api, name: str) -> None:
    status = {"capacity": {"cpu": "16", "memory": "64Gi"},
              "conditions": [{"type": "Ready", "status": "True"}],
              "lastHeartbeatTime": datetime.now(UTC).isoformat()}
    r = api.client(f"agent-{name}-token").patch(f"{HV}/{name}/status", {"status": status})
    assert r.status_code == 200, r.text


def _start_wait(kubectl: Kubectl, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(kubectl.argv("viewer-token", "wait", *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HOME": str(tmp_path)})


@pytest.mark.parametrize("version", ["current", "1.20"])
def test_kubectl_wait_for_ready_finishes(make_api: Callable[..., Api], tmp_path: Path,
                                         version: str) -> None:
    api = make_api(tls=True)
    kubectl = Kubectl(KUBECTLS[version], version, api, tmp_path)
    assert api.client().post(HV, json=hypervisor("hv1")).status_code == 201
    # Waiting for a condition that arrives later: the change after the initial state.
    proc = _start_wait(kubectl, tmp_path, "--for=condition=Ready", "hypervisor/hv1", "--timeout=60s")
    try:
        _ready(api, "hv1")
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "hypervisor.hvfleet.io/hv1 condition met" in out
    # Already Ready: the initial state alone answers.
    r = kubectl("wait", "--for=condition=Ready", "hypervisor/hv1", "--timeout=30s", token="viewer-token")
    assert r.returncode == 0, r.stderr
    assert "condition met" in r.stdout
