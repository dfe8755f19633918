"""Two `hvfleet serve` processes over one 3-member etcd, as two replicas behind a
load balancer: a form rendered by one posts to the other, a form survives a
restart of its server, and the history is the same from both and survives a
restart (issue 21, "Dashboard state per process" and its "Done when": a
3-member etcd, as replicas are deployed)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import requests

from hvfleet.store import open_store
from tests.dashboard.fleet import Fleet, hvfleet, report_fleet, serving
from tests.support.etcd_local import EtcdCluster

# Three server starts and a restart: about a minute on a quiet 2-core machine.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Fleet]]:
    tmp = tmp_path_factory.mktemp("replicas")
    with ExitStack() as stack:
        etcd = stack.enter_context(EtcdCluster(tmp / "etcd", size=3))
        store_url = etcd.url(prefix="/dashboard-replicas")
        report_fleet(store_url)
        out = []
        for i in range(2):
            (tmp / f"r{i}").mkdir()
            out.append(stack.enter_context(serving(tmp / f"r{i}", store_url)))
        out[0].token("operator", "ops")
        out[1].tokens = out[0].tokens
        yield out


def _session(fleet: Fleet, token: str) -> requests.Session:
    s = fleet.http()
    s.cookies.set("hvfleet_session", token)
    return s


def _csrf(fleet: Fleet, s: requests.Session, path: str) -> str:
    html = s.get(fleet.url + path, timeout=30).text
    m = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert m, html[:500]
    return m[1]


def _ratio(store_url: str, host: str) -> float | None:
    with open_store(store_url) as s:
        return next((v for r, v in s.get_hypervisor(host).spec.overcommit.items() if str(r) == "cpu"), None)


def test_a_form_rendered_by_one_replica_posts_to_the_other(replicas: list[Fleet]) -> None:
    a, b = replicas
    token = a.tokens["ops"]
    csrf = _csrf(a, _session(a, token), "/hosts/lab-01")
    s = _session(b, token)
    r = s.post(f"{b.url}/hosts/lab-01/actions", headers={"Origin": b.url}, allow_redirects=False,
               data={"csrf": csrf, "action": "overcommit-set", "resource": "cpu", "ratio": "3"}, timeout=30)
    assert r.status_code == 303, r.text[:300]
    assert _ratio(a.store_url, "lab-01") == 3.0
    hvfleet("overcommit", "unset", "lab-01", "cpu", "--manager", "ops", "--store", a.store_url)


def _history(fleet: Fleet, token: str, series: str) -> dict[str, Any]:
    doc = _session(fleet, token).get(f"{fleet.url}/dashboard/history.json",
                                     params={"series": series, "range": "hour"}, timeout=30).json()
    return {"t": doc["t"], "resources": doc["resources"]}


def test_history_is_the_same_on_every_replica_and_a_restart_keeps_it_and_the_forms(
        replicas: list[Fleet], tmp_path_factory: pytest.TempPathFactory) -> None:
    a, b = replicas
    token = a.tokens["ops"]
    hvfleet("overcommit", "set", "gpu-01", "cpu=2", "--manager", "ops", "--store", a.store_url)
    cli = json.loads(hvfleet("capacity", "-o", "json", "--store", a.store_url).stdout)
    effective = next(h for h in cli["hosts"] if h["name"] == "gpu-01")["effective"]["cpu"]
    deadline = time.monotonic() + 10
    while True:
        seen = [_history(f, token, "host:gpu-01") for f in (a, b)]
        if seen[0] == seen[1] and seen[0]["t"] and \
                seen[0]["resources"]["cpu"]["effective"]["text"][-1] == effective:
            break
        assert time.monotonic() < deadline, seen
        time.sleep(0.3)
    assert _history(a, token, "fleet")["t"] == _history(b, token, "fleet")["t"]
    csrf = _csrf(a, _session(a, token), "/hosts/gpu-01")
    # A restart of both replicas keeps the history and the forms already rendered.
    tmp = tmp_path_factory.mktemp("restarted")
    assert a.process is not None and b.process is not None
    for f in (a, b):
        assert f.process is not None
        f.process.terminate()
        f.process.wait(15)
    with serving(tmp, a.store_url) as again:
        after = _history(again, token, "host:gpu-01")
        assert after["t"][:len(seen[0]["t"])] == seen[0]["t"]
        assert after["resources"]["cpu"]["effective"]["text"][:len(seen[0]["t"])] == \
            seen[0]["resources"]["cpu"]["effective"]["text"]
        r = _session(again, token).post(
            f"{again.url}/hosts/gpu-01/actions", headers={"Origin": again.url}, allow_redirects=False,
            data={"csrf": csrf, "action": "overcommit-unset", "resource": "cpu"}, timeout=30)
        assert r.status_code == 303, r.text[:300]
    assert _ratio(a.store_url, "gpu-01") is None
