"""Impersonation (`Impersonate-User`, kubectl `--as`), the SelfSubjectReview
(`kubectl auth whoami`) and the atomic batch endpoint, against the real
`hvfleet serve` over TLS with real tokens of every role."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hvfleet.model import Hypervisor
from hvfleet.model.token import ROLES
from hvfleet.store import Store
from tests.support.serve import (
    GV,
    Server,
    kubeconfig_for,
    kubectl,
    snapshot,
)

STATUS_PATCH = {"status": {"observedGeneration": 3}}
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.mark.parametrize("role", [r for r in ROLES if r != "admin"])
def test_only_an_admin_may_impersonate(server: Server, store: Store, role: str) -> None:
    before = snapshot(store)
    s = server.session(server.tokens[role])
    for user in ("agent/hv1", "ops"):
        r = s.patch(f"{server.url}{GV}/hypervisors/hv1/status", data=json.dumps(STATUS_PATCH),
                    headers={**MERGE, "Impersonate-User": user}, timeout=30)
        assert r.status_code == 403, r.text
        body = r.json()
        assert body["reason"] == "Forbidden"
        assert body["message"].startswith(f'users "{user}" is forbidden: User "')
        assert "cannot impersonate" in body["message"]
        # Reads too: an impersonation is refused before anything is looked at.
        r = s.get(f"{server.url}{GV}/hypervisors/hv1", headers={"Impersonate-User": user},
                  timeout=30)
        assert r.status_code == 403
    assert snapshot(store) == before


def test_an_admin_acts_as_the_agent_it_impersonates(server: Server, store: Store) -> None:
    s = server.session(server.tokens["admin"])
    url = f"{server.url}{GV}/hypervisors/hv1/status"
    # As itself, an admin does not write a host's status...
    r = s.patch(url, data=json.dumps(STATUS_PATCH), headers=MERGE, timeout=30)
    assert r.status_code == 403
    # ...as agent/hv1 it does, and is recorded as that manager.
    r = s.patch(url, data=json.dumps(STATUS_PATCH),
                headers={**MERGE, "Impersonate-User": "agent/hv1"}, timeout=30)
    assert r.status_code == 200, r.text
    h = store.get_hypervisor("hv1")
    assert h.status.observed_generation == 3
    status_owner = [e.manager for e in h.metadata.managed_fields if "f:status" in e.fields_v1]
    assert status_owner == ["agent/hv1"]
    # As agent/hv1 it has that agent's rights only: not hv2's status, not a spec write.
    r = s.patch(f"{server.url}{GV}/hypervisors/hv2/status", data=json.dumps(STATUS_PATCH),
                headers={**MERGE, "Impersonate-User": "agent/hv1"}, timeout=30)
    assert r.status_code == 403
    r = s.patch(f"{server.url}{GV}/hypervisors/hv1", data=json.dumps({"spec": {"overcommit": {"cpu": 5}}}),
                headers={**MERGE, "Impersonate-User": "agent/hv1"}, timeout=30)
    assert r.status_code == 403 and "agents do not write spec" in r.json()["message"]
    # Any other name keeps the admin's role, under that name as field manager.
    r = s.patch(f"{server.url}{GV}/hypervisors/hv2", data=json.dumps({"spec": {"overcommit": {"cpu": 2}}}),
                headers={**MERGE, "Impersonate-User": "cortex"}, timeout=30)
    assert r.status_code == 200, r.text
    assert "cortex" in {e.manager for e in store.get_hypervisor("hv2").metadata.managed_fields}
    # Groups, uids and extras are not offered, and refused rather than ignored.
    r = s.get(f"{server.url}{GV}/hypervisors", headers={"Impersonate-User": "x",
                                                        "Impersonate-Group": "system:masters"},
              timeout=30)
    assert r.status_code == 400


def test_kubectl_as_works_for_an_admin_only(server: Server, store: Store, tmp_path: Path) -> None:
    admin = kubeconfig_for(server, server.tokens["admin"], tmp_path / "admin.yaml")
    patched = kubectl(admin, "--as", "agent/hv1", "patch", "hypervisor", "hv1",
                      "--subresource=status", "--type=merge", "-p", '{"status":{"observedGeneration":9}}')
    assert patched.returncode == 0, patched.stderr
    assert store.get_hypervisor("hv1").status.observed_generation == 9
    who = kubectl(admin, "--as", "agent/hv1", "auth", "whoami", "-o", "json")
    assert who.returncode == 0, who.stderr
    info = json.loads(who.stdout)["status"]["userInfo"]
    assert info["username"] == "agent/hv1" and "hvfleet:agent" in info["groups"]
    assert info["extra"] == {"hvfleet.io/hypervisor": ["hv1"]}
    viewer = kubeconfig_for(server, server.tokens["viewer"], tmp_path / "viewer.yaml")
    before = snapshot(store)
    refused = kubectl(viewer, "--as", "agent/hv1", "patch", "hypervisor", "hv1",
                      "--subresource=status", "--type=merge", "-p", '{"status":{"observedGeneration":1}}')
    assert refused.returncode == 1
    assert refused.stderr.startswith('Error from server (Forbidden): users "agent/hv1" is forbidden: '
                                     'User "viewer" cannot impersonate resource "users"')
    assert snapshot(store) == before
    own = kubectl(viewer, "auth", "whoami", "-o", "json")
    assert json.loads(own.stdout)["status"]["userInfo"]["username"] == "viewer"


def _hv(store: Store, name: str, **spec: Any) -> dict[str, Any]:
    doc = store.get_hypervisor(name).to_dict()
    doc["spec"].update(spec)
    return doc


def test_a_batch_is_authorized_write_by_write_and_written_whole(server: Server, store: Store) -> None:
    url = f"{server.url}{GV}/batch"
    new = Hypervisor.model_validate({"metadata": {"name": "hv3"}}).to_dict()
    writes = {"writes": [{"action": "update", "object": _hv(store, "hv1", overcommit={"cpu": 3.0})},
                         {"action": "create", "object": new}]}
    before = snapshot(store)
    # A scheduler may update hypervisors but not create them: nothing is written.
    r = server.session(server.tokens["scheduler"]).post(url, json=writes, timeout=30)
    assert r.status_code == 403, r.text
    assert 'cannot create resource "hypervisors"' in r.json()["message"]
    assert snapshot(store) == before
    r = server.session(server.tokens["operator"]).post(url, json=writes, timeout=30)
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [i["metadata"]["name"] for i in items] == ["hv1", "hv3"]
    newest = max(int(o["metadata"]["resourceVersion"]) for o in before)
    assert all(int(i["metadata"]["resourceVersion"]) > newest for i in items)
    assert store.get_hypervisor("hv1").spec.overcommit == {"cpu": 3.0}
    # A status change in a batch is a /status write: only the host's agent.
    status = store.get_hypervisor("hv2").to_dict()
    status["status"]["observedGeneration"] = 5
    before = snapshot(store)
    r = server.session(server.tokens["operator"]).post(
        url, json={"writes": [{"action": "update", "object": status}]}, timeout=30)
    assert r.status_code == 403 and '"hypervisors/status"' in r.json()["message"]
    # A stale version is a Conflict with the resourceVersion as its cause.
    stale = _hv(store, "hv2", overcommit={"cpu": 3.0})
    stale["metadata"]["resourceVersion"] = "1"
    r = server.session(server.tokens["operator"]).post(
        url, json={"writes": [{"action": "update", "object": stale}]}, timeout=30)
    assert r.status_code == 409
    assert r.json()["details"]["causes"][0]["field"] == "metadata.resourceVersion"
    # A Reservation is created only by a claim.
    res = {"apiVersion": "hvfleet.io/v1", "kind": "Reservation", "metadata": {"name": "r9"},
           "spec": {"hypervisor": "hv1", "consumer": "c", "resources": {"cpu": 1}}}
    r = server.session(server.tokens["admin"]).post(
        url, json={"writes": [{"action": "create", "object": res}]}, timeout=30)
    assert r.status_code == 422 and "claim" in r.json()["message"]
    assert snapshot(store) == before
