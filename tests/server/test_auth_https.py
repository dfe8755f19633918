"""The real `hvfleet serve` over TLS with real tokens and the role table: 403s
write nothing, agents write only their own status as agent/<name>, revoked and
expired tokens get 401, and kubectl prints Forbidden as it does for kube-apiserver."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from hvfleet.model import ObjectMeta
from hvfleet.model.token import (
    ROLES,
    AccessToken,
    AccessTokenSpec,
    Role,
    hash_secret,
    new_secret,
    token_text,
)
from hvfleet.server.identity import Verb
from hvfleet.store import Store
from tests.support.etcd_local import EtcdCluster
from tests.support.kubectl import KUBECTLS
from tests.support.role_matrix import EXPECTED
from tests.support.serve import (
    GV,
    HVFLEET,
    Server,
    changed,
    kubeconfig_for,
    kubectl,
    reset_fleet,
    role_tokens,
    snapshot,
    start_server,
    stop_server,
)

# -- one HTTP request per (verb, resource[/status], name) -----------------------------------------

_counter = iter(range(1_000_000))


def request_for(s: Store, verb: Verb, key: str, name: str) -> tuple[str, str, dict[str, Any]]:
    """(method, path, requests kwargs) doing `verb` on `key` for object `name`."""
    plural, _, sub = key.partition("/")
    if plural in ("fit", "placement"):
        body = {"resources": {"cpu": 1}} if plural == "fit" else {}
        return "POST", f"{GV}/{plural}", {"json": body}
    if plural == "release":
        return "POST", f"{GV}/reservations/r1/release", {}
    obj_name = "r1" if plural == "reservations" else name
    path = f"{GV}/{plural}/{obj_name}" + (f"/{sub}" if sub else "")
    if verb == "get":
        return "GET", path, {}
    if verb in ("list", "watch"):
        params = {"fieldSelector": f"metadata.name={obj_name}"}
        if verb == "watch":
            params.update(watch="true", timeoutSeconds="1")
        return "GET", f"{GV}/{plural}", {"params": params, "stream": True}
    if verb == "delete":
        return "DELETE", path, {}
    if verb == "create":
        if plural in ("hypervisors", "leases"):
            doc: dict[str, Any] = {"apiVersion": "hvfleet.io/v1",
                                   "kind": "Hypervisor" if plural == "hypervisors" else "Lease",
                                   "metadata": {"name": name}}
        else:
            doc = {"apiVersion": "hvfleet.io/v1", "kind": "Reservation",
                   "metadata": {"name": f"r-new-{next(_counter)}"},
                   "spec": {"hypervisor": "hv1", "resources": {"cpu": 1}, "consumer": "vm-2"}}
        return "POST", f"{GV}/{plural}", {"json": doc}
    kind = {"hypervisors": "Hypervisor", "reservations": "Reservation", "leases": "Lease"}[plural]
    current = s.get(kind, obj_name).to_dict()
    if verb == "update":
        if sub:
            if plural == "hypervisors":
                current["status"]["observedGeneration"] = 1
            else:
                current["status"]["message"] = "put"
        else:
            current["metadata"]["labels"] = {"put": "yes"}
        return "PUT", path, {"json": current}
    patch: dict[str, Any] = (
        {"status": {"observedGeneration": 2}} if sub and plural == "hypervisors"
        else {"status": {"message": "patched"}} if sub
        else {"metadata": {"labels": {"patched": "yes"}}}
    )
    return "PATCH", path, {"data": json.dumps(patch),
                           "headers": {"Content-Type": "application/merge-patch+json"}}


HTTP_KEYS = ("hypervisors", "hypervisors/status", "reservations", "reservations/status", "leases",
             "fit", "release", "placement")
# What HTTP has for each: a subresource is get/update/patch; an action endpoint is POST.
HTTP_VERBS: dict[str, tuple[Verb, ...]] = {
    "hypervisors": ("get", "list", "watch", "create", "update", "patch", "delete"),
    "reservations": ("get", "list", "watch", "create", "update", "patch", "delete"),
    "leases": ("get", "list", "watch", "create", "update", "patch", "delete"),
    "hypervisors/status": ("get", "update", "patch"),
    "reservations/status": ("get", "update", "patch"),
    "fit": ("create",), "release": ("create",), "placement": ("create",),
}
HTTP_CASES = [(role, verb, key, name) for role in ROLES for key in HTTP_KEYS
              for verb in HTTP_VERBS[key] for name in ("hv1", "hv2")
              if name == "hv1" or key.startswith(("hypervisors", "leases"))]


def test_the_role_matrix_over_https_and_a_403_writes_nothing(server: Server, store: Store) -> None:
    sessions = {role: server.session(server.tokens[role]) for role in ROLES}
    mismatches: list[str] = []
    for role, verb, key, name in HTTP_CASES:
        own = name == "hv1"
        expected = verb in EXPECTED[role].get(key, "").split() and (own or role != "agent")
        before = snapshot(store)
        method, path, kw = request_for(store, verb, key, name)
        with sessions[role].request(method, server.url + path, timeout=30, **kw) as resp:
            code = resp.status_code
            body = resp.json() if code == 403 else None
        case = f"{role} {verb} {key} {name}: {code}"
        assert code != 401 and code < 500, case
        if code == 403:
            assert body is not None and body["kind"] == "Status" and body["reason"] == "Forbidden", case
            if snapshot(store) != before:
                mismatches.append(f"{case} but the store changed")
        if (code != 403) != expected:
            mismatches.append(f"{case}, expected {'allowed' if expected else '403'}")
        if code != 403 and snapshot(store) != before:
            reset_fleet(store)
    assert mismatches == []


def test_a_viewer_cannot_write_and_the_store_is_unchanged(server: Server, store: Store) -> None:
    viewer = server.session(server.tokens["viewer"])
    before = snapshot(store)
    r = viewer.patch(server.url + f"{GV}/hypervisors/hv1",
                     data=json.dumps({"spec": {"overcommit": {"cpu": 4}}}),
                     headers={"Content-Type": "application/merge-patch+json"}, timeout=30)
    assert r.status_code == 403
    assert r.json()["message"].startswith('hypervisors.hvfleet.io "hv1" is forbidden: User "viewer"')
    assert viewer.get(server.url + f"{GV}/hypervisors/hv1", timeout=30).status_code == 200
    assert snapshot(store) == before


def test_an_agent_writes_only_its_own_status_as_its_own_manager(server: Server, store: Store) -> None:
    agent = server.session(server.token("agent", hypervisor="hv3"))
    base = server.url + GV
    created = agent.post(base + "/hypervisors", json={
        "apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": "hv3"}}, timeout=30)
    assert created.status_code == 201, created.text
    patch = {"status": {"capacity": {"cpu": 8}}}
    r = agent.patch(base + "/hypervisors/hv3/status", data=json.dumps(patch),
                    headers={"Content-Type": "application/merge-patch+json"}, timeout=30)
    assert r.status_code == 200, r.text
    managers = {e["manager"] for e in r.json()["metadata"]["managedFields"]}
    assert managers == {"agent/hv3"}
    assert store.get_hypervisor("hv3").status.capacity == {"cpu": 8}
    before = snapshot(store)
    for path, body in (("/hypervisors/hv1/status", patch),
                       ("/hypervisors/hv3", {"spec": {"overcommit": {"cpu": 2}}})):
        r = agent.patch(base + path, data=json.dumps(body),
                        headers={"Content-Type": "application/merge-patch+json"}, timeout=30)
        assert r.status_code == 403, (path, r.text)
    assert agent.get(base + "/hypervisors/hv1", timeout=30).status_code == 403
    assert agent.get(base + "/hypervisors", timeout=30).status_code == 403
    own = agent.get(base + "/hypervisors", params={"fieldSelector": "metadata.name=hv3"}, timeout=30)
    assert [i["metadata"]["name"] for i in own.json()["items"]] == ["hv3"]
    # A fieldManager the client names is not who the write is recorded as.
    r = agent.patch(base + "/hypervisors/hv3/status", params={"fieldManager": "agent/hv1"},
                    data=json.dumps({"status": {"capacity": {"cpu": 9}}}),
                    headers={"Content-Type": "application/merge-patch+json"}, timeout=30)
    assert r.status_code == 200
    assert {e["manager"] for e in r.json()["metadata"]["managedFields"]} == {"agent/hv3"}
    after = snapshot(store)
    # the refused writes wrote nothing; the last one once
    assert changed(before, after) == {("Hypervisor", "hv3")}
    assert int(store.get_hypervisor("hv3").metadata.resource_version or 0) > max(
        int(o["metadata"]["resourceVersion"]) for o in before)
    lines = [json.loads(line) for line in server.audit_log.read_text().splitlines()]
    mine = [e for e in lines if e["user"] and e["user"]["subject"] == "agent/hv3"]
    assert [(e["verb"], e["objectRef"].get("subresource"), e["code"]) for e in mine][-3:] == [
        ("patch", "status", 403), ("patch", None, 403), ("patch", "status", 200)]


def test_a_revoked_token_gets_401_within_the_cache_time(server: Server, store: Store) -> None:
    text = server.token("operator", name="soon-gone")
    ops = server.session(text)
    assert ops.get(server.url + f"{GV}/hypervisors", timeout=30).status_code == 200
    revoke = subprocess.run(
        [HVFLEET, "token", "revoke", text, "--store", server.store_url],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )
    assert revoke.returncode == 0, revoke.stderr
    revoked_at = time.monotonic()
    while True:
        r = ops.get(server.url + f"{GV}/hypervisors", timeout=30)
        if r.status_code == 401:
            break
        assert r.status_code == 200
        assert time.monotonic() - revoked_at < 1.0 + 1.0, "still accepted after the cache time"
        time.sleep(0.05)
    assert r.json()["reason"] == "Unauthorized"


def test_an_expired_and_an_unknown_token_get_401(server: Server, store: Store) -> None:
    expired = server.token("viewer", name="old", ttl=timedelta(hours=1),
                           now=datetime.now(UTC) - timedelta(hours=2))
    for token in (expired, "hvf_0123456789abcdef_" + "x" * 43, None):
        r = server.session(token).get(server.url + f"{GV}/hypervisors", timeout=30)
        assert r.status_code == 401, token
        assert r.json()["kind"] == "Status"


# -- kubectl ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", sorted(KUBECTLS))
def test_kubectl_over_tls_prints_forbidden_as_for_kube_apiserver(
    server: Server, store: Store, tmp_path: Path, version: str
) -> None:
    viewer = kubeconfig_for(server, server.tokens["viewer"], tmp_path / "viewer.yaml")

    def kubectl(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KUBECTLS[version], "--kubeconfig", str(config), *args],
                              capture_output=True, text=True, timeout=120)

    got = kubectl(viewer, "get", "hypervisors", "-o", "name")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["hypervisor.hvfleet.io/hv1", "hypervisor.hvfleet.io/hv2"]
    before = snapshot(store)
    denied = kubectl(viewer, "delete", "hypervisor", "hv1")
    assert denied.returncode == 1
    assert denied.stderr.strip() == (
        'Error from server (Forbidden): hypervisors.hvfleet.io "hv1" is forbidden: User "viewer" '
        'cannot delete resource "hypervisors" in API group "hvfleet.io": '
        "role viewer reads and watches only"
    )
    assert snapshot(store) == before


@pytest.mark.parametrize("role", ["operator", "admin", "scheduler"])
def test_kubectl_patch_of_status_with_a_non_agent_token_is_refused(
    server: Server, store: Store, tmp_path: Path, role: Role
) -> None:
    config = kubeconfig_for(server, server.tokens[role], tmp_path / f"{role}.yaml")
    before = snapshot(store)
    out = kubectl(config, "patch", "hypervisor", "hv1", "--subresource=status", "--type=merge",
                  "-p", '{"status":{"observedGeneration":7}}')
    assert out.returncode == 1
    assert out.stderr.startswith('Error from server (Forbidden): hypervisors.hvfleet.io "hv1" is '
                                 f'forbidden: User "{role}" cannot patch resource "hypervisors/status"')
    assert snapshot(store) == before


# -- replicas ---------------------------------------------------------------------------------------

def test_two_replicas_over_one_etcd_share_tokens_and_a_revoke(
    etcd_session: EtcdCluster, tmp_path: Path
) -> None:
    url = etcd_session.url(prefix=f"/auth-{uuid.uuid4().hex[:12]}")
    tokens = role_tokens(url)
    replicas = [start_server(tmp_path / f"r{i}", url, tokens) for i in (1, 2)]
    sessions = [r.session(tokens["operator"]) for r in replicas]
    try:
        created = sessions[0].post(replicas[0].url + f"{GV}/hypervisors", json={
            "apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": "hv1"}},
            timeout=30)
        assert created.status_code == 201, created.text
        got = sessions[1].get(replicas[1].url + f"{GV}/hypervisors/hv1", timeout=30)
        assert got.status_code == 200 and got.json()["metadata"]["managedFields"] == []
        revoke = subprocess.run([HVFLEET, "token", "revoke", tokens["operator"], "--store", url],
                                capture_output=True, text=True, timeout=60)
        assert revoke.returncode == 0, revoke.stderr
        revoked_at = time.monotonic()
        pending = {0, 1}
        while pending:
            for i in sorted(pending):
                code = sessions[i].get(replicas[i].url + f"{GV}/hypervisors", timeout=30).status_code
                if code == 401:
                    pending.discard(i)
                else:
                    assert code == 200
            assert time.monotonic() - revoked_at < 2.0, f"replicas {pending} still accept a revoked token"
            time.sleep(0.05)
        # The other roles' tokens still work on both.
        for r in replicas:
            assert r.session(tokens["viewer"]).get(r.url + f"{GV}/hypervisors", timeout=30).status_code == 200
    finally:
        for session in sessions:
            session.close()  # so the servers need not wait out the TLS goodbye on stop
        for r in replicas:
            stop_server(r)


def test_only_roles_that_may_force_take_over_anothers_field(server: Server, store: Store) -> None:
    base = server.url + f"{GV}/hypervisors/hv1"
    operator, scheduler = (server.session(server.tokens[r]) for r in ("operator", "scheduler"))
    apply = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": "hv1"},
             "spec": {"overcommit": {"cpu": 4}}}
    headers = {"Content-Type": "application/apply-patch+yaml"}
    r = operator.patch(base, data=json.dumps(apply), headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    apply["spec"] = {"overcommit": {"cpu": 8}}
    r = scheduler.patch(base, data=json.dumps(apply), headers=headers, timeout=30)
    assert r.status_code == 409 and r.json()["reason"] == "Conflict"
    before = snapshot(store)
    r = scheduler.patch(base, params={"force": "true"}, data=json.dumps(apply), headers=headers,
                        timeout=30)
    assert r.status_code == 403 and "role scheduler may not force" in r.json()["message"]
    assert snapshot(store) == before
    apply["spec"] = {"overcommit": {"cpu": 2}}
    r = operator.patch(base, params={"force": "true"}, data=json.dumps(apply), headers=headers,
                       timeout=30)
    assert r.status_code == 200
    assert store.get_hypervisor("hv1").spec.overcommit == {"cpu": 2.0}


def test_an_update_takes_anothers_field_only_for_a_role_that_may_force(
        server: Server, store: Store) -> None:
    """Update and patch take the fields they change (conflicts are for apply),
    but roles still decide: a scheduler, which may not force, may not take an
    operator's field by update either (403, nothing written), and may write a
    field nobody else owns."""
    base = server.url + f"{GV}/hypervisors/hv1"
    operator, scheduler = (server.session(server.tokens[r]) for r in ("operator", "scheduler"))
    merge = {"Content-Type": "application/merge-patch+json"}
    r = operator.patch(base, data=json.dumps({"spec": {"overcommit": {"cpu": 4}}}), headers=merge,
                       timeout=30)
    assert r.status_code == 200, r.text
    before = snapshot(store)
    r = scheduler.patch(base, data=json.dumps({"spec": {"overcommit": {"cpu": 8}}}), headers=merge,
                        timeout=30)
    assert r.status_code == 403, r.text
    assert "may not take fields other managers own: spec.overcommit.cpu" in r.json()["message"]
    doc = scheduler.get(base, timeout=30).json()
    doc["spec"]["overcommit"] = {"cpu": 8}
    r = scheduler.put(base, data=json.dumps(doc), headers={"Content-Type": "application/json"},
                      timeout=30)
    assert r.status_code == 403, r.text
    # Nor through the apply kubectl sends for its last-applied annotation, which
    # is written as an update.
    apply = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": "hv1"},
             "spec": {"overcommit": {"cpu": 8}}}
    r = scheduler.patch(base, params={"fieldManager": "kubectl-last-applied"},
                        data=json.dumps(apply), headers={"Content-Type": "application/apply-patch+yaml"},
                        timeout=30)
    assert r.status_code == 403, r.text
    assert snapshot(store) == before
    r = scheduler.patch(base, data=json.dumps({"spec": {"overcommit": {"memory": 2}}}),
                        headers=merge, timeout=30)
    assert r.status_code == 200, r.text
    # The operator's patch takes the scheduler's field: no conflict, ownership moves.
    r = operator.patch(base, data=json.dumps({"spec": {"overcommit": {"memory": 1.5}}}),
                       headers=merge, timeout=30)
    assert r.status_code == 200, r.text
    owners = {(e["manager"], e["operation"]): e["fieldsV1"] for e in r.json()["metadata"]["managedFields"]}
    assert owners[("operator", "Update")]["f:spec"]["f:overcommit"] == {"f:cpu": {}, "f:memory": {}}
    assert all("f:spec" not in f for (m, _), f in owners.items() if m == "scheduler")


def test_plain_http_is_served_on_loopback_when_asked_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/hvfleet.db"
    token = role_tokens(url)["viewer"]
    proc = subprocess.Popen(
        [HVFLEET, "serve", "--store", url, "--listen", "127.0.0.1:0", "--insecure-http",
         "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        m = re.match(r"hvfleet serve: (http://127\.0\.0\.1:\d+) over ", proc.stdout.readline())
        assert m is not None
        session = requests.Session()
        session.trust_env = False
        deadline = time.monotonic() + 60
        while True:
            try:
                r = session.get(m[1] + f"{GV}/hypervisors", timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert r.status_code == 401
        r = session.get(m[1] + f"{GV}/hypervisors", headers={"Authorization": f"Bearer {token}"},
                        timeout=5)
        assert r.status_code == 200
        assert not (tmp_path / "data").exists()  # no certificate was made for plain HTTP
    finally:
        proc.terminate()
        proc.wait(timeout=15)


# -- tokens over the API (admins only) ---------------------------------------------------------------

def test_an_admin_issues_revokes_and_deletes_tokens_over_the_api(
    server: Server, store: Store, tmp_path: Path
) -> None:
    admin = server.session(server.tokens["admin"])
    base = server.url + f"{GV}/accesstokens"
    r = admin.post(base, json={"role": "agent", "hypervisor": "hv7", "ttl": "1h"}, timeout=30)
    assert r.status_code == 201, r.text
    doc = r.json()
    text, token_id = doc["status"]["token"], doc["metadata"]["name"]
    assert doc["spec"]["subject"] == "agent/hv7" and doc["spec"]["role"] == "agent"
    agent = server.session(text)
    own = agent.get(server.url + f"{GV}/hypervisors", params={"fieldSelector": "metadata.name=hv7"},
                    timeout=30)
    assert own.status_code == 200
    listed = admin.get(base, timeout=30).json()
    assert token_id in [t["metadata"]["name"] for t in listed["items"]]
    assert text.rsplit("_", 1)[-1] not in json.dumps(listed)
    assert admin.get(f"{base}/{token_id}", timeout=30).json()["spec"]["revoked"] is False
    r = admin.post(f"{base}/{token_id}/revoke", timeout=30)
    assert r.status_code == 200 and r.json()["spec"]["revoked"] is True
    # The replica that revoked it refuses it at once (the others within their cache age).
    assert agent.get(server.url + f"{GV}/hypervisors", params={"fieldSelector": "metadata.name=hv7"},
                     timeout=30).status_code == 401
    assert admin.delete(f"{base}/{token_id}", timeout=30).status_code == 200
    assert admin.get(f"{base}/{token_id}", timeout=30).status_code == 404
    assert admin.post(base, json={"role": "agent"}, timeout=30).status_code == 422
    assert admin.post(base, json={"role": "viewer", "owner": "x"}, timeout=30).status_code in (400, 422)
    audit = server.audit_log.read_text()
    assert text not in audit and text.rsplit("_", 1)[-1] not in audit
    # kubectl reaches it too, as a raw path (it is not in discovery).
    body = tmp_path / "request.json"
    body.write_text(json.dumps({"role": "viewer", "name": "dashboard", "ttl": "12h"}))
    config = kubeconfig_for(server, server.tokens["admin"], tmp_path / "admin.yaml")
    out = kubectl(config, "create", "--raw", f"{GV}/accesstokens", "-f", str(body))
    assert out.returncode == 0, out.stderr
    viewer_text = json.loads(out.stdout)["status"]["token"]
    assert server.session(viewer_text).get(server.url + f"{GV}/hypervisors", timeout=30).status_code == 200


@pytest.mark.parametrize("role", ["viewer", "operator", "scheduler", "agent"])
def test_only_admins_reach_tokens_and_a_refusal_writes_nothing(
    server: Server, store: Store, role: Role
) -> None:
    s = server.session(server.tokens[role])
    base = server.url + f"{GV}/accesstokens"
    token_id = server.tokens["viewer"].split("_")[1]
    before = snapshot(store)
    for method, path, kw in (
        ("GET", base, {}), ("POST", base, {"json": {"role": "admin"}}),
        ("GET", f"{base}/{token_id}", {}), ("GET", f"{base}/0123456789abcdef", {}),
        ("POST", f"{base}/{token_id}/revoke", {}), ("DELETE", f"{base}/{token_id}", {}),
    ):
        r = s.request(method, path, timeout=30, **kw)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        assert r.json()["reason"] == "Forbidden"
    assert snapshot(store) == before


def test_token_records_travel_the_generic_store_mapping_without_their_secret(
    server: Server, store: Store
) -> None:
    """What a remote Store backend does for `hvfleet token create`: the client
    hashes, the server stores the record, and the secret never crosses the wire."""
    token_id, secret = new_secret()
    record = AccessToken(
        metadata=ObjectMeta(name=token_id),
        spec=AccessTokenSpec(subject="remote-viewer", role="viewer", secret_sha256=hash_secret(secret)),
    )
    admin = server.session(server.tokens["admin"])
    base = server.url + f"{GV}/accesstokens"
    r = admin.post(base, json=record.to_dict(), timeout=30)
    assert r.status_code == 201, r.text
    stored = r.json()
    assert "token" not in stored.get("status", {})
    viewer = server.session(token_text(token_id, secret))
    assert viewer.get(server.url + f"{GV}/hypervisors", timeout=30).status_code == 200
    # Every role but admin is refused the write, and nothing changes.
    before = snapshot(store)
    stored["spec"]["revoked"] = True
    for role in ("viewer", "operator", "scheduler", "agent"):
        r = server.session(server.tokens[role]).put(f"{base}/{token_id}", json=stored, timeout=30)
        assert r.status_code == 403, (role, r.text)
    assert snapshot(store) == before
    stale = {**stored, "metadata": {**stored["metadata"], "resourceVersion": "1"}}
    assert admin.put(f"{base}/{token_id}", json=stale, timeout=30).status_code == 409
    r = admin.put(f"{base}/{token_id}", params={"force": "true"}, json=stored, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["revoked"] is True
    assert viewer.get(server.url + f"{GV}/hypervisors", timeout=30).status_code == 401
    bad = {**stored, "spec": {**stored["spec"], "subject": "agent/hv1"}}
    bad["metadata"] = {"name": "00000000000000aa"}
    assert admin.post(base, json=bad, timeout=30).status_code == 422


def test_the_kubernetes_python_client_uses_the_kubeconfig_as_is(
    server: Server, store: Store, tmp_path: Path
) -> None:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config
    from kubernetes.client.rest import ApiException

    def objects(role: Role) -> Any:
        path = kubeconfig_for(server, server.tokens[role], tmp_path / f"{role}.yaml")
        return k8s.CustomObjectsApi(k8s_config.new_client_from_config(config_file=str(path)))

    viewer = objects("viewer")
    listed = viewer.list_cluster_custom_object("hvfleet.io", "v1", "hypervisors")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["hv1", "hv2"]
    before = snapshot(store)
    with pytest.raises(ApiException) as err:
        viewer.patch_cluster_custom_object("hvfleet.io", "v1", "hypervisors", "hv1",
                                           {"spec": {"maintenance": "drain"}})
    assert err.value.status == 403
    assert json.loads(err.value.body)["reason"] == "Forbidden"
    assert snapshot(store) == before
    patched = objects("operator").patch_cluster_custom_object(
        "hvfleet.io", "v1", "hypervisors", "hv1", {"spec": {"maintenance": "drain"}})
    owners = {e["manager"]: e["fieldsV1"] for e in patched["metadata"]["managedFields"]}
    assert owners["operator"] == {"f:spec": {"f:maintenance": {}}}
