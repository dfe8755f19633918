"""Issue 16 §1 through the real `hvfleet serve` over HTTPS with real tokens: no
write can poison what every reader needs. A value past a field's bound is 422
naming the field and writes nothing; an object that does not decode (put into
SQLite or etcd behind the server) leaves list, watch, the Table behind
`kubectl get` and fit answering, shows as Unknown, and an admin can delete it."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvfleet.model import NotFound
from hvfleet.store import Store, open_store
from tests.bounds_cases import CASES, Case, doc, spoiled
from tests.store.poison import HUGE, hypervisor_doc, poison
from tests.support.etcd_local import EtcdCluster
from tests.support.serve import (
    GV,
    KUBECTLS,
    Server,
    kubeconfig_for,
    kubectl,
    reset_fleet,
    role_tokens,
    snapshot,
    start_server,
    stop_server,
)

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
MERGE = {"Content-Type": "application/merge-patch+json"}
PLURAL = {"Hypervisor": "hypervisors", "Reservation": "reservations", "Lease": "leases",
          "OvercommitPolicy": "overcommitpolicies"}



@pytest.fixture
def store(server: Server) -> Iterator[Store]:
    with open_store(server.store_url) as s:
        with suppress(NotFound):
            s.delete("Hypervisor", "bad")  # left by a test that failed half-way
        reset_fleet(s)
        for p in s.list_overcommit_policies():
            s.delete("OvercommitPolicy", p.name)
        yield s


def _session(server: Server, role: str) -> requests.Session:
    return server.session(server.tokens[role])


def _invalid(r: requests.Response, field: str) -> None:
    assert r.status_code == 422, r.text[:2000]
    body = r.json()
    assert body["kind"] == "Status" and body["reason"] == "Invalid", body
    fields = [c.get("field") for c in body.get("details", {}).get("causes", [])]
    assert field in fields, (field, body)


def _still_answering(server: Server) -> None:
    """list (JSON and Table), a watch, fit and claims' reader all answer."""
    viewer = _session(server, "viewer")
    listed = viewer.get(server.url + f"{GV}/hypervisors", timeout=30)
    assert listed.status_code == 200, listed.text[:500]
    assert viewer.get(server.url + f"{GV}/hypervisors", headers={"Accept": TABLE},
                      timeout=30).status_code == 200
    assert viewer.get(server.url + f"{GV}/leases", timeout=30).status_code == 200
    watched = viewer.get(server.url + f"{GV}/hypervisors",
                         params={"watch": "true", "timeoutSeconds": "1"}, timeout=30)
    assert watched.status_code == 200
    fit = _session(server, "scheduler").post(server.url + f"{GV}/fit",
                                             json={"resources": {"cpu": "1"}}, timeout=30)
    assert fit.status_code == 200, fit.text[:500]


# -- the reproductions --------------------------------------------------------------------------

def test_an_agents_status_patch_with_a_4000_digit_quantity_is_422_and_writes_nothing(
    server: Server, store: Store
) -> None:
    before = snapshot(store)
    body = '{"status":{"capacity":{"cpu":' + HUGE + "}}}"
    r = _session(server, "agent").patch(server.url + f"{GV}/hypervisors/hv1/status", data=body,
                                        headers=MERGE, timeout=30)
    _invalid(r, "status.capacity.cpu")
    assert snapshot(store) == before
    _still_answering(server)


def test_an_operators_extra_capacity_past_the_bound_is_422_and_writes_nothing(
    server: Server, store: Store
) -> None:
    before = snapshot(store)
    ops = _session(server, "operator")
    for value in ("1e90", '"1e90"', '"1e30"', HUGE, '"0.0000000001"'):
        body = '{"spec":{"extraCapacity":{"VGPU":' + value + "}}}"
        r = ops.patch(server.url + f"{GV}/hypervisors/hv1", data=body, headers=MERGE, timeout=30)
        _invalid(r, "spec.extraCapacity.VGPU")
    r = ops.patch(server.url + f"{GV}/hypervisors/hv1", data='{"spec":{"overcommit":{"cpu":1e9}}}',
                  headers=MERGE, timeout=30)
    _invalid(r, "spec.overcommit")
    assert snapshot(store) == before
    _still_answering(server)


@pytest.mark.parametrize(("patch", "field"), [
    ({"spec": {"leaseDurationSeconds": 100_000_000_000_000}}, "spec.leaseDurationSeconds"),
    ({"spec": {"renewTime": "9999-12-31T23:59:59Z"}}, "spec.renewTime"),
    ({"spec": {"acquireTime": "9999-12-31T23:59:59Z"}}, "spec.acquireTime"),
])
def test_an_agents_lease_past_its_bounds_is_422_and_writes_nothing(
    server: Server, store: Store, patch: dict[str, Any], field: str
) -> None:
    before = snapshot(store)
    r = _session(server, "agent").patch(server.url + f"{GV}/leases/hv1", data=json.dumps(patch),
                                        headers=MERGE, timeout=30)
    _invalid(r, field)
    assert snapshot(store) == before
    _still_answering(server)


def test_a_heartbeat_in_year_9999_is_422(server: Server, store: Store) -> None:
    before = snapshot(store)
    r = _session(server, "agent").patch(
        server.url + f"{GV}/hypervisors/hv1/status",
        data=json.dumps({"status": {"lastHeartbeatTime": "9999-12-31T23:59:59Z"}}),
        headers=MERGE, timeout=30)
    _invalid(r, "status.lastHeartbeatTime")
    assert snapshot(store) == before


# -- an object that does not decode ------------------------------------------------------------------

def _check_poisoned_fleet(server: Server, tmp_path: Path) -> None:
    """`bad` does not decode: every reader answers, it shows Unknown, admin deletes it."""
    _still_answering(server)
    viewer = _session(server, "viewer")
    listed = viewer.get(server.url + f"{GV}/hypervisors", timeout=30)
    assert "bad" not in [i["metadata"]["name"] for i in listed.json()["items"]]
    assert "Hypervisor bad" in listed.headers.get("Warning", "")
    table = viewer.get(server.url + f"{GV}/hypervisors", headers={"Accept": TABLE}, timeout=30).json()
    rows = {r["cells"][0]: r["cells"] for r in table["rows"]}
    assert sorted(rows) == ["bad", "hv1", "hv2"]
    assert rows["bad"][1] == "Unknown" and set(rows["bad"][2:]) == {"-"}
    assert rows["hv1"][2] != "-"  # a host that decodes shows its numbers
    one = viewer.get(server.url + f"{GV}/hypervisors/bad", headers={"Accept": TABLE}, timeout=30)
    assert one.status_code == 200 and one.json()["rows"][0]["cells"][:2] == ["bad", "Unknown"]
    got = viewer.get(server.url + f"{GV}/hypervisors/bad", timeout=30)
    assert got.status_code == 500 and "status.capacity.cpu" in got.json()["message"]
    # What an operator types.
    config = kubeconfig_for(server, server.tokens["viewer"], tmp_path / "kubeconfig")
    for version, binary in sorted(KUBECTLS.items()):
        shown = kubectl(config, "get", "hypervisors", binary=binary)
        assert shown.returncode == 0, (version, shown.stderr)
        line = next(x for x in shown.stdout.splitlines() if x.startswith("bad "))
        assert line.split()[1] == "Unknown", (version, shown.stdout)
        assert "cannot be read" in shown.stderr, (version, shown.stderr)
    # Counted where Prometheus scrapes.
    metrics = viewer.get(server.url + "/metrics", timeout=30)
    assert metrics.status_code == 200
    counted = re.search(r'^hvfleet_store_undecodable_skipped_total\{kind="Hypervisor"\} (\S+)$',
                        metrics.text, re.M)
    assert counted is not None and float(counted[1]) >= 1, metrics.text[-2000:]
    # An agent cannot delete it; an admin can.
    assert _session(server, "agent").delete(server.url + f"{GV}/hypervisors/bad",
                                            timeout=30).status_code == 403
    gone = _session(server, "admin").delete(server.url + f"{GV}/hypervisors/bad", timeout=30)
    assert gone.status_code == 200, gone.text
    assert gone.json()["status"] == "Success"
    assert viewer.get(server.url + f"{GV}/hypervisors/bad", timeout=30).status_code == 404
    assert "Warning" not in viewer.get(server.url + f"{GV}/hypervisors", timeout=30).headers


def test_a_poisoned_sqlite_row_leaves_every_reader_answering_and_admin_deletes_it(
    server: Server, store: Store, tmp_path: Path
) -> None:
    poison(server.store_url, "Hypervisor", "bad", hypervisor_doc("bad"))
    _check_poisoned_fleet(server, tmp_path)


def test_a_poisoned_etcd_key_leaves_every_reader_answering_and_admin_deletes_it(
    etcd_session: EtcdCluster, tmp_path: Path
) -> None:
    url = etcd_session.url(prefix=f"/bounds-{uuid.uuid4().hex[:12]}")
    tokens = role_tokens(url)
    with open_store(url) as s:
        reset_fleet(s)
    srv = start_server(tmp_path / "serve", url, tokens)
    try:
        poison(url, "Hypervisor", "bad", hypervisor_doc("bad"))
        _check_poisoned_fleet(srv, tmp_path)
    finally:
        stop_server(srv)


def test_an_admin_replaces_a_poisoned_object_with_put(server: Server, store: Store) -> None:
    rev = poison(server.store_url, "Hypervisor", "bad", hypervisor_doc("bad"))
    put = _session(server, "admin").put(server.url + f"{GV}/hypervisors/bad", json={
        "apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
        "metadata": {"name": "bad", "resourceVersion": str(rev)}, "spec": {"overcommit": {"cpu": 2}}},
        timeout=30)
    assert put.status_code == 200, put.text
    back = _session(server, "viewer").get(server.url + f"{GV}/hypervisors/bad", timeout=30).json()
    assert back["spec"]["overcommit"] == {"cpu": 2.0} and back["metadata"]["uid"] == "uid-bad"


# -- the property: any field of any kind, past its bound -------------------------------------------

def _write(server: Server, store: Store, case: Case, value: Any) -> requests.Response:
    """Send `value` at the case's field as the role that writes that part."""
    plural = PLURAL[case.kind]
    role, method, path = "operator", "PUT", f"{GV}/{plural}/hv1"
    if case.kind == "Lease":
        role, body = "agent", spoiled(store.get("Lease", "hv1").to_dict(), case.path, value)
    elif case.kind == "Hypervisor" and case.path[0] == "status":
        base = store.get("Hypervisor", "hv1").to_dict()
        base["status"] = doc("Hypervisor", "hv1")["status"]
        role, path, body = "agent", path + "/status", spoiled(base, case.path, value)
    elif case.kind == "Hypervisor":
        base = store.get("Hypervisor", "hv1").to_dict()
        fresh = doc("Hypervisor", "hv1")
        base["spec"], base["metadata"]["labels"] = fresh["spec"], fresh["metadata"]["labels"]
        base["metadata"]["annotations"] = fresh["metadata"]["annotations"]
        body = spoiled(base, case.path, value)
    else:
        body = spoiled(doc(case.kind, "new-1"), case.path, value)
        body.pop("status", None)
        role = "scheduler" if case.kind == "Reservation" else "operator"
        method, path = "POST", f"{GV}/{plural}"
    # As json.dumps writes it: requests refuses Infinity, which a client may send.
    return _session(server, role).request(method, server.url + path, data=json.dumps(body),
                                          headers={"Content-Type": "application/json"}, timeout=30)


API_CASES = [c for c in CASES if c.kind in PLURAL
             # A Reservation's status is not part of its claim.
             and not (c.kind == "Reservation" and c.path[0] == "status")]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_field_of_any_kind_past_its_bound_is_422_and_nothing_is_written(
    server: Server, store: Store, data: st.DataObject
) -> None:
    case = data.draw(st.sampled_from(API_CASES), label="case")
    value = data.draw(case.values, label="value")
    before = snapshot(store)
    r = _write(server, store, case, value)
    assert r.status_code in (400, 422), (case, r.status_code, r.text[:1000])
    if r.status_code == 422:
        _invalid(r, case.field)
    assert snapshot(store) == before
    _still_answering(server)


def test_a_token_record_that_does_not_decode_is_an_unknown_token(server: Server, store: Store) -> None:
    text = server.token("viewer", name="spoiled-viewer")
    token_id = text.removeprefix("hvf_").split("_", 1)[0]
    assert server.session(text).get(server.url + f"{GV}/hypervisors", timeout=30).status_code == 200
    poison(server.store_url, "AccessToken", token_id, b'{"kind": "AccessToken", "spec": 1}')
    # The server keeps a token record for at most a second (TokenAuthenticator.max_age).
    deadline = time.monotonic() + 10
    while True:
        r = server.session(text).get(server.url + f"{GV}/hypervisors", timeout=30)
        if r.status_code != 200 or time.monotonic() > deadline:
            break
    assert r.status_code == 401, r.text
    with suppress(NotFound):
        store.delete("AccessToken", token_id)


def test_a_fit_for_more_than_any_host_can_hold_is_422_not_500(server: Server, store: Store) -> None:
    sched = _session(server, "scheduler")
    for body in ('{"resources": {"cpu": ' + HUGE + "}}", '{"resources": {"memory": "1e30"}}',
                 '{"resources": {"cpu": "1e21"}, "count": ' + HUGE + "}"):
        r = sched.post(server.url + f"{GV}/fit", data=body,
                       headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 422, (body[:60], r.text[:500])
        assert r.json()["details"]["causes"][0]["field"].startswith("resources."), r.text[:500]
    _still_answering(server)
