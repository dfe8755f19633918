"""Field ownership as kubectl sees it (issue 16, section 4), with kubectl 1.20
and a current kubectl against a real `hvfleet serve` over HTTPS: server-side
apply keeps the labels it does not own, edit/patch/replace take the fields
they change (conflicts are for apply), client-side apply keeps labels, and a
write that changes nothing is not written."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import yaml

from hvfleet.model.hypervisor import Resource
from tests.server.clients import Kubectl
from tests.server.objects import agent_reports


def _manifest(tmp: Path, labels: dict[str, str] | None = None, **spec: Any) -> Path:
    path = tmp / f"hv1-{len(list(tmp.iterdir()))}.yaml"
    meta: dict[str, Any] = {"name": "hv1"}
    if labels is not None:
        meta["labels"] = labels
    doc: dict[str, Any] = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": meta}
    if spec:
        doc["spec"] = spec
    path.write_text(yaml.safe_dump(doc))
    return path


def _owners(obj: Resource) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e.manager, e.operation): e.fields_v1 for e in obj.metadata.managed_fields}


def _who_owns(obj: Resource, *path: str) -> set[tuple[str, str]]:
    out = set()
    for key, fields in _owners(obj).items():
        node: Any = fields
        for part in path:
            node = node.get(f"f:{part}") if isinstance(node, dict) else None
        if node is not None:
            out.add(key)
    return out


def _ok(r: Any) -> None:
    assert r.returncode == 0, r.stderr


def test_server_side_apply_from_two_managers_keeps_every_label_it_does_not_own(
        kubectl: Kubectl, tmp_path: Path) -> None:
    store = kubectl.api.store
    _ok(kubectl.apply(_manifest(tmp_path, {"az": "a", "role": "compute"}, overcommit={"cpu": 4})))
    _ok(kubectl.apply(_manifest(tmp_path, reserved={"memory": "1Gi"}), token="ops2-token"))
    h = store.get_hypervisor("hv1")
    assert h.metadata.labels == {"az": "a", "role": "compute"}
    assert h.spec.overcommit == {"cpu": 4.0} and str(h.spec.reserved["memory"]) == "1Gi"  # type: ignore[index]
    assert _who_owns(h, "metadata", "labels", "az") == {("ops", "Apply")}
    assert _who_owns(h, "spec", "reserved", "memory") == {("ops2", "Apply")}
    # The second manager applies again, still without labels: nothing of ops' moves.
    _ok(kubectl.apply(_manifest(tmp_path, reserved={"memory": "2Gi"}), token="ops2-token"))
    assert store.get_hypervisor("hv1").metadata.labels == {"az": "a", "role": "compute"}
    # ops drops `role` from its manifest: exactly that label goes.
    _ok(kubectl.apply(_manifest(tmp_path, {"az": "a"}, overcommit={"cpu": 4})))
    h = store.get_hypervisor("hv1")
    assert h.metadata.labels == {"az": "a"}
    assert str(h.spec.reserved["memory"]) == "2Gi"  # type: ignore[index]


def test_edit_patch_and_replace_of_a_field_another_manager_owns_succeed_and_move_it(
        kubectl: Kubectl, tmp_path: Path) -> None:
    store = kubectl.api.store
    _ok(kubectl.apply(_manifest(tmp_path, {"az": "a"}, overcommit={"cpu": 4})))
    agent_reports(kubectl.api, "hv1", "3")
    uid = store.get_hypervisor("hv1").metadata.uid
    # patch (kubectl-patch) as ops2: no conflict, ownership moves to ops2's Update.
    _ok(kubectl("patch", "hv", "hv1", "--type", "merge", "-p",
                '{"spec":{"overcommit":{"cpu":2}},"metadata":{"labels":{"az":"b"}}}',
                token="ops2-token"))
    h = store.get_hypervisor("hv1")
    assert h.spec.overcommit == {"cpu": 2.0} and h.metadata.labels == {"az": "b"}
    assert _who_owns(h, "spec", "overcommit", "cpu") == {("ops2", "Update")}
    assert _who_owns(h, "metadata", "labels", "az") == {("ops2", "Update")}
    # edit as ops, through an editor that rewrites the ratio.
    editor = tmp_path / "editor.sh"
    editor.write_text('#!/bin/sh\nsed -i -e "s/^\\(    cpu: \\)2\\(\\.0\\)\\{0,1\\}$/\\13/" "$1"\n')
    editor.chmod(editor.stat().st_mode | stat.S_IEXEC)
    _ok(subprocess.run(kubectl.argv("ops-token", "edit", "hv", "hv1"), capture_output=True,
                       text=True, timeout=120,
                       env={**os.environ, "HOME": str(tmp_path), "KUBE_EDITOR": str(editor)}))
    h = store.get_hypervisor("hv1")
    assert h.spec.overcommit == {"cpu": 3.0}
    assert _who_owns(h, "spec", "overcommit", "cpu") == {("ops", "Update")}
    # replace (PUT) as ops2 of the whole object, with the ratio changed.
    doc = kubectl.api.client().get("/apis/hvfleet.io/v1/hypervisors/hv1").json()
    doc["spec"]["overcommit"]["cpu"] = 5
    path = tmp_path / "replace.yaml"
    path.write_text(yaml.safe_dump(doc))
    _ok(kubectl("replace", "-f", str(path), token="ops2-token"))
    h = store.get_hypervisor("hv1")
    assert h.spec.overcommit == {"cpu": 5.0}
    assert _who_owns(h, "spec", "overcommit", "cpu") == {("ops2", "Update")}
    # The same object throughout, its status untouched.
    assert h.metadata.uid == uid and h.status.allocation["cpu"] == 3  # type: ignore[index]
    # Apply still conflicts with the new owner.
    r = kubectl.apply(_manifest(tmp_path, {"az": "a"}, overcommit={"cpu": 4}))
    assert r.returncode == 1 and 'conflict with "ops2"' in r.stderr


def test_client_side_apply_keeps_labels_and_its_force_never_recreates(
        kubectl: Kubectl, tmp_path: Path) -> None:
    store = kubectl.api.store
    listed = _manifest(tmp_path, {"az": "a", "role": "compute"}, overcommit={"cpu": 4})
    _ok(kubectl("apply", "-f", str(listed)))
    agent_reports(kubectl.api, "hv1", "3")
    uid = store.get_hypervisor("hv1").metadata.uid
    # Another manager takes the ratio by server-side apply.
    _ok(kubectl.apply(_manifest(tmp_path, overcommit={"cpu": 2}), "--force-conflicts",
                      token="ops2-token"))
    # ops' client-side apply of its manifest again (a merge patch): labels stay,
    # the ratio comes back (a patch takes it), the same object.
    _ok(kubectl("apply", "-f", str(listed)))
    h = store.get_hypervisor("hv1")
    assert h.metadata.labels == {"az": "a", "role": "compute"}
    assert h.spec.overcommit == {"cpu": 4.0}
    assert "kubectl.kubernetes.io/last-applied-configuration" in h.metadata.annotations
    # With --force too: the patch succeeds, so nothing is deleted and recreated.
    _ok(kubectl("apply", "--force", "-f", str(_manifest(
        tmp_path, {"az": "a", "role": "compute"}, overcommit={"cpu": 6}))))
    h = store.get_hypervisor("hv1")
    assert h.spec.overcommit == {"cpu": 6.0} and h.metadata.labels == {"az": "a", "role": "compute"}
    assert h.metadata.uid == uid and h.status.allocation["cpu"] == 3  # type: ignore[index]


def test_client_side_then_server_side_apply_keeps_the_labels_it_lists(
        kubectl: Kubectl, tmp_path: Path) -> None:
    """A current kubectl's `apply --server-side` of an object that carries a
    client-side apply's last-applied annotation follows its apply with a second
    one holding only that annotation (field manager `kubectl-last-applied`).
    Both come from one identity here; the second must not prune the labels the
    first just applied."""
    store = kubectl.api.store
    _ok(kubectl("apply", "-f", str(_manifest(tmp_path, {"az": "a"}, overcommit={"cpu": 4}))))
    listed = _manifest(tmp_path, {"az": "b", "role": "compute"}, overcommit={"cpu": 2})
    at = store.revision()
    _ok(kubectl.apply(listed))
    _ok(kubectl.apply(listed))
    h = store.get_hypervisor("hv1")
    assert h.metadata.labels == {"az": "b", "role": "compute"}
    assert h.spec.overcommit == {"cpu": 2.0}
    # Not even for a moment (kubectl re-applies after its follow-up, which would
    # hide a wipe from the final state): every write since keeps them.
    events = list(store.watch("Hypervisor", since=at, timeout=0.5))
    assert events and all(e.object.metadata.labels == {"az": "b", "role": "compute"}
                          for e in events)


def test_an_identical_apply_or_an_empty_patch_is_no_write(kubectl: Kubectl, tmp_path: Path) -> None:
    store = kubectl.api.store
    listed = _manifest(tmp_path, {"az": "a"}, overcommit={"cpu": 4})
    _ok(kubectl.apply(listed))
    before = store.get_hypervisor("hv1")
    at = store.revision()
    _ok(kubectl.apply(listed))
    _ok(kubectl("patch", "hv", "hv1", "--type", "merge", "-p", "{}"))
    doc = kubectl.api.client().get("/apis/hvfleet.io/v1/hypervisors/hv1").json()
    path = tmp_path / "same.yaml"
    path.write_text(yaml.safe_dump(doc))
    _ok(kubectl("replace", "-f", str(path)))
    assert store.revision() == at
    assert list(store.watch("Hypervisor", since=at, timeout=0.5)) == []
    after = store.get_hypervisor("hv1")
    assert after == before and after.metadata.generation == before.metadata.generation


NULLS = """\
apiVersion: hvfleet.io/v1
kind: OvercommitPolicy
metadata:
  name: {name}
  labels:
  annotations:
spec:
  selector:
  overcommit: {{cpu: 2}}
  priority:
"""


def test_empty_maps_in_a_templated_manifest_are_absent_as_kube_reads_them(
        kubectl: Kubectl, tmp_path: Path) -> None:
    """`labels:` or `selector:` left empty (null) was 422 "Input should be a
    valid dictionary" for `kubectl create` and `apply --server-side` (client
    side apply passed only because kubectl strips nulls itself)."""
    store = kubectl.api.store
    for verb, name in (("create", "by-create"), ("apply", "by-apply")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(NULLS.format(name=name))
        done = kubectl("create", "-f", str(path)) if verb == "create" else kubectl.apply(path)
        assert done.returncode == 0, done.stderr
        policy = store.get("OvercommitPolicy", name)
        assert policy.metadata.labels == {} and policy.spec.overcommit == {"cpu": 2.0}
