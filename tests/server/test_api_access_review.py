"""SelfSubjectAccessReview / SelfSubjectRulesReview and deletecollection,
against the real `hvfleet serve` with a real token per role: every review
answers what the guard decides (checked against the role table written out by
hand in tests/support/role_matrix.py), `kubectl auth can-i` (1.20 and current) prints it,
and a DELETE on a collection removes what its selector matches, for the roles
that may, and nothing for the others."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from hvfleet.model.token import ROLES, Role
from hvfleet.store import Store
from tests.server.running import write_kubeconfig
from tests.support.kubectl import KUBECTLS
from tests.support.role_matrix import EXPECTED, RESOURCES, VERBS
from tests.support.serve import GV, Server

SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
SSRR = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
# Who may delete a whole collection, by hand: where operators and admins delete.
DELETECOLLECTION = {"operator": {"hypervisors", "overcommitpolicies", "reservations"},
                    "admin": {"hypervisors", "overcommitpolicies", "reservations"}}



def review(server: Server, role: Role, verb: str, key: str, name: str | None = None,
           group: str = "hvfleet.io") -> dict[str, Any]:
    resource, _, sub = key.partition("/")
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": sub,
                  "name": name or "", "namespace": "default"}
    r = server.session(server.tokens[role]).post(server.url + SSAR, json={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes}})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["kind"] == "SelfSubjectAccessReview" and body["spec"]["resourceAttributes"] == attributes
    status: dict[str, Any] = body["status"]
    return status


@pytest.mark.parametrize("role", ROLES)
def test_access_review_answers_what_the_guard_decides_for_every_verb_and_resource(
        server: Server, role: Role) -> None:
    for key in RESOURCES:
        for verb in (*VERBS, "deletecollection"):
            if verb == "deletecollection":
                expected = key in DELETECOLLECTION.get(role, set())
            else:
                expected = verb in EXPECTED[role].get(key, "").split()
            on_own = review(server, role, verb, key, "hv1")
            assert on_own["allowed"] is expected, (role, verb, key, on_own)
            if not expected:
                # The guard's own refusal, as kubectl would print it.
                assert "forbidden" in on_own["reason"], on_own
            # Another host's name: agents lose everything, the other roles nothing; a
            # policy's name is no host's: an agent's read of policies is narrowed instead.
            narrowed = role == "agent" and key == "overcommitpolicies"
            assert review(server, role, verb, key, "hv2")["allowed"] is (
                expected and (role != "agent" or narrowed))


def test_access_review_of_the_whole_collection_and_outside_the_group(server: Server) -> None:
    # An agent lists only its own name, so not the collection.
    assert review(server, "agent", "list", "hypervisors")["allowed"] is False
    assert review(server, "viewer", "list", "hypervisors")["allowed"] is True
    # "*" is every verb: nobody but admin has all of them on reservations, and not even
    # admin on hypervisors (the status is the agent's).
    assert review(server, "admin", "*", "reservations")["allowed"] is False
    assert review(server, "admin", "*", "tokens")["allowed"] is False
    assert review(server, "operator", "get", "pods", group="")["allowed"] is False
    assert review(server, "viewer", "create", "selfsubjectaccessreviews",
                  group="authorization.k8s.io")["allowed"] is True
    # No token: 401 as for every request.
    r = server.session(None).post(server.url + SSAR, json={"spec": {"resourceAttributes": {
        "verb": "get", "resource": "hypervisors"}}})
    assert r.status_code == 401


def test_rules_review_lists_the_callers_rules(server: Server) -> None:
    def rules(role: Role) -> dict[tuple[str, str | None], set[str]]:
        r = server.session(server.tokens[role]).post(server.url + SSRR, json={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": "default"}})
        assert r.status_code == 201, r.text
        out: dict[tuple[str, str | None], set[str]] = {}
        for rule in r.json()["status"]["resourceRules"]:
            for res in rule["resources"]:
                names = rule.get("resourceNames")
                out[(res, names[0] if names else None)] = set(rule["verbs"])
        return out

    viewer = rules("viewer")
    assert viewer[("hypervisors", None)] == {"get", "list", "watch"}
    assert ("tokens", None) not in viewer
    agent = rules("agent")
    assert ("hypervisors", None) not in agent
    assert agent[("hypervisors", "hv1")] == {"get", "list", "watch", "create"}
    assert agent[("hypervisors/status", "hv1")] == {"get", "update", "patch"}
    operator = rules("operator")
    assert operator[("hypervisors", None)] == {"get", "list", "watch", "create", "update", "patch",
                                               "delete", "deletecollection"}


def _kubectl(server: Server, binary: str, tmp: Path, role: Role,
             *args: str) -> subprocess.CompletedProcess[str]:
    config = write_kubeconfig(tmp / f"kc-{role}", server.url, server.tokens[role], server.ca)
    return subprocess.run([binary, f"--kubeconfig={config}", f"--cache-dir={tmp}/cache-{role}",
                           "auth", "can-i", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(tmp)})


@pytest.mark.parametrize("version", sorted(KUBECTLS))
def test_kubectl_auth_can_i_answers_for_every_role(server: Server, tmp_path: Path, version: str) -> None:
    binary = KUBECTLS[version]
    cases: list[tuple[Role, tuple[str, ...], bool]] = [
        ("viewer", ("list", "hypervisors"), True),
        ("viewer", ("patch", "hv"), False),
        ("operator", ("create", "hypervisors"), True),
        ("operator", ("delete", "reservations"), True),
        ("operator", ("create", "reservations"), False),
        ("scheduler", ("create", "reservations"), True),
        ("scheduler", ("delete", "hypervisors"), False),
        ("agent", ("update", "hypervisors/hv1", "--subresource=status"), True),
        ("agent", ("update", "hypervisors/hv2", "--subresource=status"), False),
        ("agent", ("list", "hypervisors"), False),
        # Not in discovery (kubectl warns), authorized as "tokens".
        ("admin", ("create", "accesstokens"), True),
        ("operator", ("create", "accesstokens"), False),
        ("scheduler", ("create", "fit"), True),
        ("admin", ("update", "hypervisors/hv1", "--subresource=status"), False),
    ]
    for role, args, allowed in cases:
        r = _kubectl(server, binary, tmp_path, role, *args)
        assert r.returncode == (0 if allowed else 1), (role, args, r.stdout, r.stderr)
        assert r.stdout.startswith("yes" if allowed else "no"), (role, args, r.stdout, r.stderr)
    r = _kubectl(server, binary, tmp_path, "viewer", "--list")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:] if line.strip()}
    assert "[get list watch]" in rows["hypervisors.hvfleet.io"]
    assert "accesstokens.hvfleet.io" not in rows
    r = _kubectl(server, binary, tmp_path, "admin", "--list")
    assert "accesstokens.hvfleet.io" in r.stdout


def test_deletecollection_removes_what_the_selector_matches(server: Server, store: Store) -> None:
    for name, rack in (("hv3", "x"), ("hv4", "x"), ("hv5", "y")):
        r = server.session(server.tokens["operator"]).post(server.url + f"{GV}/hypervisors", json={
            "apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
            "metadata": {"name": name, "labels": {"rack": rack}}})
        assert r.status_code == 201, r.text
    # Roles that may not: 403, nothing deleted.
    for role in ("viewer", "scheduler", "agent"):
        r = server.session(server.tokens[role]).delete(server.url + f"{GV}/hypervisors",
                                                       params={"labelSelector": "rack=x"})
        assert r.status_code == 403, (role, r.text)
        assert r.json()["reason"] == "Forbidden"
        assert "deletecollection" in r.json()["message"]
    assert {"hv3", "hv4", "hv5"} <= {h.name for h in store.list_hypervisors()}
    # A dry run answers what it would delete and deletes nothing.
    r = server.session(server.tokens["operator"]).delete(
        server.url + f"{GV}/hypervisors", params={"labelSelector": "rack=x", "dryRun": "All"})
    assert r.status_code == 200, r.text
    assert sorted(o["metadata"]["name"] for o in r.json()["items"]) == ["hv3", "hv4"]
    assert {"hv3", "hv4"} <= {h.name for h in store.list_hypervisors()}
    # The kubernetes client's delete_collection: only what the selector matches.
    config = write_kubeconfig(server.data_dir.parent / "kc-op", server.url,
                              server.tokens["operator"], server.ca)
    objects = k8s.CustomObjectsApi(k8s_config.new_client_from_config(config_file=str(config)))
    out = objects.delete_collection_cluster_custom_object("hvfleet.io", "v1", "hypervisors",
                                                          label_selector="rack=x")
    assert out["kind"] == "HypervisorList"
    assert sorted(o["metadata"]["name"] for o in out["items"]) == ["hv3", "hv4"]
    assert sorted(h.name for h in store.list_hypervisors()) == ["hv1", "hv2", "hv5"]
    with pytest.raises(ApiException) as err:
        objects.delete_collection_cluster_custom_object("hvfleet.io", "v1", "hypervisors",
                                                        label_selector="rack in (")
    assert err.value.status == 400
    assert sorted(h.name for h in store.list_hypervisors()) == ["hv1", "hv2", "hv5"]


def test_the_python_client_asks_an_access_review(server: Server) -> None:
    config = write_kubeconfig(server.data_dir.parent / "kc-agent", server.url,
                              server.tokens["agent"], server.ca)
    authz = k8s.AuthorizationV1Api(k8s_config.new_client_from_config(config_file=str(config)))

    def ask(verb: str, name: str) -> bool:
        review = k8s.V1SelfSubjectAccessReview(spec=k8s.V1SelfSubjectAccessReviewSpec(
            resource_attributes=k8s.V1ResourceAttributes(
                verb=verb, group="hvfleet.io", resource="hypervisors", subresource="status",
                name=name)))
        out = authz.create_self_subject_access_review(review)
        return bool(out.status.allowed)

    assert ask("patch", "hv1") is True
    assert ask("patch", "hv2") is False
    rules = authz.create_self_subject_rules_review(k8s.V1SelfSubjectRulesReview(
        spec=k8s.V1SelfSubjectRulesReviewSpec(namespace="default")))
    assert any(r.resource_names == ["hv1"] and "hypervisors/status" in r.resources
               for r in rules.status.resource_rules)


def test_setting_owner_references_takes_the_right_to_delete(server: Server, store: Store) -> None:
    """An owner reference arranges the object's deletion (the garbage collector),
    so a scheduler, which may patch a hypervisor but not delete one, may not
    set one; an operator may."""
    owner = store.get("Hypervisor", "hv2")
    refs = {"metadata": {"ownerReferences": [{"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
                                              "name": "hv2", "uid": owner.metadata.uid}]}}
    before = store.get("Hypervisor", "hv1").metadata.resource_version
    r = server.session(server.tokens["scheduler"]).patch(
        server.url + f"{GV}/hypervisors/hv1", data=json.dumps(refs),
        headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 403, r.text
    assert 'cannot delete resource "hypervisors"' in r.json()["message"]
    assert store.get("Hypervisor", "hv1").metadata.resource_version == before
    r = server.session(server.tokens["operator"]).patch(
        server.url + f"{GV}/hypervisors/hv1", data=json.dumps(refs),
        headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    assert store.get("Hypervisor", "hv1").metadata.owner_references
