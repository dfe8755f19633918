"""generateName, finalizers and ownerReferences over the API, as Kubernetes
clients use them: kubectl (1.20 and current) `create` with generateName, a
DELETE that waits for finalizers (deletionTimestamp, then gone when the last
is removed), and dependents garbage-collected after their owner's DELETE."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.server.clients import Kubectl, api_client
from tests.server.conftest import Api
from tests.server.objects import HV, hypervisor, status_of
from tests.server.watching import Watcher, names
from tests.support.kubectl import KUBECTLS


@pytest.fixture(params=sorted(KUBECTLS))
def kubectl(request: pytest.FixtureRequest, make_api: Callable[..., Api], tmp_path: Path) -> Kubectl:
    """Each kubectl against its own server over TLS (as in test_api_kubectl)."""
    return Kubectl(KUBECTLS[request.param], request.param, make_api(tls=True), tmp_path)


def _eventually(test: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_kubectl_create_with_generate_name(kubectl: Kubectl, tmp_path: Path) -> None:
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
                                    "metadata": {"generateName": "compute-"}}))
    made = []
    for _ in range(2):
        r = kubectl("create", "-f", str(path))
        assert r.returncode == 0, r.stderr
        (line,) = r.stdout.splitlines()
        assert line.startswith("hypervisor.hvfleet.io/compute-") and line.endswith(" created")
        made.append(line.split()[0].split("/")[1])
    assert len(set(made)) == 2 and all(len(n) == len("compute-") + 5 for n in made)
    assert sorted(h.name for h in kubectl.api.store.list_hypervisors()) == sorted(made)


def test_generate_name_over_the_python_client_and_its_errors(make_api: Callable[..., Api],
                                                            tmp_path: Path) -> None:
    api = make_api(tls=True)
    objects = k8s.CustomObjectsApi(api_client(api, tmp_path))
    body = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"generateName": "hv-"}}
    made = objects.create_cluster_custom_object("hvfleet.io", "v1", "hypervisors", body)
    assert made["metadata"]["name"].startswith("hv-") and made["metadata"]["generateName"] == "hv-"
    c = api.client()
    # Neither a name nor a generateName; a prefix no name can start with.
    r = c.post(HV, json={"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {}})
    status_of(422, "Invalid", r.json())
    r = c.post(HV, json={"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
                         "metadata": {"generateName": "Bad_"}})
    status_of(422, "Invalid", r.json())
    assert r.json()["details"]["causes"][0]["field"] == "metadata.generateName"
    assert [h.name for h in api.store.list_hypervisors()] == [made["metadata"]["name"]]


def test_a_delete_waits_for_finalizers(api: Api) -> None:
    c = api.client()
    doc = hypervisor("hv1")
    doc["metadata"]["finalizers"] = ["example.com/drain"]
    assert c.post(HV, json=doc).status_code == 201
    w = Watcher(api, {"resourceVersion": c.get(HV).json()["metadata"]["resourceVersion"]})
    r = c.delete(f"{HV}/hv1")
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["deletionTimestamp"]
    kept = c.get(f"{HV}/hv1").json()
    assert kept["metadata"]["deletionTimestamp"] == r.json()["metadata"]["deletionTimestamp"]
    # No new finalizer while deleting (422 naming the field); the deletion cannot be undone.
    r = c.patch(f"{HV}/hv1", {"metadata": {"finalizers": ["example.com/drain", "example.com/x"]}})
    status_of(422, "Invalid", r.json())
    assert r.json()["details"]["causes"][0]["field"] == "metadata.finalizers"
    r = c.patch(f"{HV}/hv1", {"metadata": {"deletionTimestamp": None, "labels": {"x": "y"}}})
    assert r.status_code == 200 and r.json()["metadata"]["deletionTimestamp"]
    # Removing the last finalizer deletes it.
    r = c.patch(f"{HV}/hv1", {"metadata": {"finalizers": None}})
    assert r.status_code == 200, r.text
    status_of(404, "NotFound", c.get(f"{HV}/hv1").json())
    w.wait_for(lambda ev: ("DELETED", "hv1") in names(ev))
    assert names(w.kinds()) == [("MODIFIED", "hv1"), ("MODIFIED", "hv1"), ("MODIFIED", "hv1"),
                                ("DELETED", "hv1")]
    w.close()
    # A client cannot create an object already being deleted.
    doc["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    r = c.post(HV, json=doc)
    assert r.status_code == 201 and "deletionTimestamp" not in r.json()["metadata"]


def _owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"]}


@pytest.mark.parametrize("via", ["kubectl", "http"])
def test_dependents_are_collected_after_their_owner_is_deleted(
        kubectl: Kubectl, tmp_path: Path, via: str) -> None:
    c = kubectl.api.client()
    owner = c.post(HV, json=hypervisor("owner")).json()
    other = c.post(HV, json=hypervisor("other")).json()
    for name, by in (("dep1", owner), ("dep2", owner), ("keep", other)):
        doc = hypervisor(name)
        doc["metadata"]["ownerReferences"] = [_owner_ref(by)]
        r = c.post(HV, json=doc)
        assert r.status_code == 201, r.text
        assert r.json()["metadata"]["ownerReferences"] == [_owner_ref(by)]
    bad = hypervisor("bad")
    bad["metadata"]["ownerReferences"] = [{**_owner_ref(owner), "kind": "Pod", "apiVersion": "v1"}]
    status_of(422, "Invalid", c.post(HV, json=bad).json())
    if via == "kubectl":
        r = kubectl("delete", "hv", "owner")
        assert r.returncode == 0, r.stderr
    else:
        assert c.delete(f"{HV}/owner").status_code == 200
    store = kubectl.api.store
    _eventually(lambda: sorted(h.name for h in store.list_hypervisors()) == ["keep", "other"])


@pytest.mark.parametrize("cascade", ["orphan", "foreground"])
def test_kubectl_delete_cascade_orphan_keeps_the_dependents_and_foreground_deletes_them_first(
        kubectl: Kubectl, cascade: str) -> None:
    """`kubectl delete --cascade=orphan` (propagationPolicy Orphan): the
    dependents stay, without the owner's reference, and the owner goes after
    (it was ignored, and the collector deleted them). `--cascade=foreground`:
    the dependents are deleted first; while one is held by a finalizer, the
    owner is kept, marked, with `foregroundDeletion`, and goes after it."""
    c = kubectl.api.client()
    store = kubectl.api.store
    owner = c.post(HV, json=hypervisor("owner")).json()
    other = c.post(HV, json=hypervisor("other")).json()
    for name, refs in (("dep1", [_owner_ref(owner)]), ("dep2", [_owner_ref(owner), _owner_ref(other)]),
                       ("held", [_owner_ref(owner)])):
        doc = hypervisor(name)
        doc["metadata"]["ownerReferences"] = refs
        if name == "held":
            doc["metadata"]["finalizers"] = ["example.com/keep"]
        assert c.post(HV, json=doc).status_code == 201
    r = kubectl("delete", "hv", "owner", f"--cascade={cascade}", "--wait=false")
    assert r.returncode == 0, r.stderr
    if cascade == "orphan":
        left = ["dep1", "dep2", "held", "other"]
        _eventually(lambda: sorted(h.name for h in store.list_hypervisors()) == left)
        time.sleep(0.5)  # the collector has had its turn: nothing more goes
        kept = {h.name: h.metadata.owner_references for h in store.list_hypervisors()}
        assert kept["dep1"] is None and kept["held"] is None
        assert [ref.name for ref in kept["dep2"] or []] == ["other"]
        assert sorted(kept) == ["dep1", "dep2", "held", "other"]
        return
    # dep1 goes; dep2 has another owner that exists, and is still deleted (kube deletes
    # every dependent of a foreground deletion); `held` waits for its finalizer.
    _eventually(lambda: sorted(h.name for h in store.list_hypervisors()) == ["held", "other", "owner"])
    marked = c.get(f"{HV}/owner").json()["metadata"]
    assert marked["finalizers"] == ["foregroundDeletion"] and marked["deletionTimestamp"]
    assert c.get(f"{HV}/held").json()["metadata"]["deletionTimestamp"]
    released = c.patch(f"{HV}/held", {"metadata": {"finalizers": None}})
    assert released.status_code == 200, released.text
    _eventually(lambda: sorted(h.name for h in store.list_hypervisors()) == ["other"])


def test_invalid_delete_options_are_refused_and_delete_nothing(api: Api) -> None:
    c = api.client()
    assert c.post(HV, json=hypervisor("kept")).status_code == 201
    for options in ({"propagationPolicy": "Bogus"},
                    {"propagationPolicy": "Orphan", "orphanDependents": True}):
        r = c.delete(f"{HV}/kept", json={"kind": "DeleteOptions", "apiVersion": "v1", **options})
        status_of(422, "Invalid", r.json())
        assert "propagationPolicy" in r.json()["message"]
    status_of(422, "Invalid", c.delete(f"{HV}/kept", params={"propagationPolicy": "bogus"}).json())
    assert c.get(f"{HV}/kept").status_code == 200
