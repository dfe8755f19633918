"""dryRun=All, as kube-apiserver serves it: every check of the write
(decoding, validation, authorization, the store's ownership rules, a claim's
fit) and the answer the write would give, with nothing written. Each verb's
dry run is compared with the real write made right after it; the store's
state (every object and the revision) is compared before and after each dry
run. On SQLite and on etcd, and through kubectl --dry-run=server."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvfleet.model.hypervisor import STORED_KINDS
from hvfleet.server.audit import audit_event
from hvfleet.server.auth import RoleAuthorizer
from hvfleet.server.identity import Action
from tests.server.clients import Kubectl, manifest
from tests.server.conftest import Api
from tests.server.objects import HV, RES, hypervisor, ready_host, reservation, status_of
from tests.server.static_auth import RecordingAudit
from tests.support.etcd_local import EtcdCluster
from tests.support.kubectl import KUBECTLS

DRY = {"dryRun": "All"}
APPLY = "application/apply-patch+yaml"


def state(api: Api) -> tuple[int, list[dict[str, Any]]]:
    """Everything the store holds (access tokens too), and its revision."""
    objects = [o.to_dict() for kind in STORED_KINDS for o in api.store.list(kind).items]
    return api.store.revision(), objects


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """An answer without what a dry run cannot know yet, as in Kubernetes: the
    resourceVersion, and the times in managedFields (a create's uid and
    creationTimestamp are made when it is written)."""
    out = json.loads(json.dumps(doc))
    meta = out["metadata"]
    for key in ("resourceVersion", "uid", "creationTimestamp"):
        meta.pop(key, None)
    for entry in meta.get("managedFields", []):
        entry.pop("time", None)
    return out


def dry_then_real(api: Api, call: Callable[[dict[str, str]], Any], code: int = 200) -> Any:
    """The call as a dry run (nothing changes in the store), then for real;
    both answers alike. Returns the real answer."""
    before = state(api)
    dry = call(DRY)
    assert dry.status_code == code, dry.text
    assert state(api) == before, "a dry run wrote"
    real = call({})
    assert real.status_code == code, real.text
    assert comparable(dry.json()) == comparable(real.json())
    return real


@pytest.fixture(params=["sqlite", "etcd"])
def roles_api(request: pytest.FixtureRequest, make_api: Callable[..., Api]) -> tuple[Api, RecordingAudit]:
    audit = RecordingAudit()
    url = None
    if request.param == "etcd":
        etcd: EtcdCluster = request.getfixturevalue("etcd_session")
        url = etcd.url(prefix=f"/test-{uuid.uuid4().hex[:12]}")
    return make_api(store_url=url, authorizer=RoleAuthorizer(), audit=audit), audit


def test_every_verb_dry_run_answers_as_the_write_and_writes_nothing(
    roles_api: tuple[Api, RecordingAudit]
) -> None:
    api, audit = roles_api
    ops, agent, sched = api.client(), api.client("agent-hv1-token"), api.client("sched-token")
    # POST
    dry_then_real(api, lambda q: ops.post(HV, params=q, json=hypervisor("hv1", overcommit={"cpu": 2})),
                  201)
    dry = ops.post(HV, params=DRY, json=hypervisor("hv9")).json()
    assert "resourceVersion" not in dry["metadata"] and dry["metadata"]["uid"]
    # PUT (compare-and-swap on the version read: a dry run does not move it)
    current = ops.get(f"{HV}/hv1").json()
    current["spec"]["maintenance"] = "drain"
    got = dry_then_real(api, lambda q: ops.put(f"{HV}/hv1", params=q, json=current))
    # PATCH, merge
    dry_then_real(api, lambda q: ops.patch(f"{HV}/hv1", {"spec": {"reserved": {"cpu": 1}}}, params=q))
    # PATCH, server-side apply: an update, then a create
    doc = yaml.safe_dump(hypervisor("hv1", overcommit={"cpu": 3}))
    dry_then_real(api, lambda q: ops.patch(f"{HV}/hv1", doc, APPLY, params=q))
    doc = yaml.safe_dump(hypervisor("hv2"))
    dry_then_real(api, lambda q: ops.patch(f"{HV}/hv2", doc, APPLY, params=q), 201)
    # /status, by the host's agent
    status = {"status": {"capacity": {"cpu": "8", "memory": "16Gi"},
                         "conditions": [{"type": "Ready", "status": "True"}]}}
    dry_then_real(api, lambda q: agent.patch(f"{HV}/hv1/status", status, params=q))
    # A Reservation is a claim: a dry run says whether it would fit.
    ready_host(api, "hv3", cpu="4")
    dry_then_real(api, lambda q: sched.post(RES, params=q, json=reservation("r1", "3", host="hv3")),
                  201)
    refused = dry_then_real(api, lambda q: sched.post(RES, params=q,
                                                      json=reservation("r2", "2", "vm-2", "hv3")), 409)
    assert "cpu" in refused.json()["message"]
    # DELETE (with a DeleteOptions body, as client-go sends a dry run, too)
    dry_then_real(api, lambda q: ops.delete(f"{RES}/r1", params=q))
    before = state(api)
    r = ops.delete(f"{HV}/hv2", json={"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]})
    assert r.status_code == 200, r.text
    assert state(api) == before
    # The audit says which writes were dry runs, and they keep the version.
    dry_runs = [rec for rec in audit.records if rec.action.dry_run]
    assert len(dry_runs) == 11 and all(rec.code in (200, 201, 409) for rec in dry_runs)
    put = next(rec for rec in dry_runs if rec.action.verb == "update")
    assert put.before == put.after == current["metadata"]["resourceVersion"]
    assert got.json()["metadata"]["resourceVersion"] != put.after


def test_a_dry_run_is_refused_as_the_write_would_be(roles_api: tuple[Api, RecordingAudit]) -> None:
    api, _ = roles_api
    ops = api.client()
    assert ops.post(HV, json=hypervisor("hv1", overcommit={"cpu": 2})).status_code == 201
    before = state(api)
    # Forbidden callers: a viewer, an agent writing spec, another agent's status.
    r = api.client("viewer-token").patch(f"{HV}/hv1", {"spec": {"maintenance": "drain"}}, params=DRY)
    status_of(403, "Forbidden", r.json())
    r = api.client("agent-hv1-token").patch(f"{HV}/hv1", {"spec": {"maintenance": "drain"}},
                                            params=DRY)
    status_of(403, "Forbidden", r.json())
    r = api.client("viewer-token").delete(f"{HV}/hv1", params=DRY)
    status_of(403, "Forbidden", r.json())
    r = ops.patch(f"{HV}/hv1/status", {"status": {"capacity": {"cpu": "8"}}}, params=DRY)
    status_of(403, "Forbidden", r.json())
    # The store's own rules: another manager's field, a stale version, a taken name.
    r = api.client("ops2-token").patch(f"{HV}/hv1", yaml.safe_dump(hypervisor("hv1", overcommit={"cpu": 3})),
                                       APPLY, params=DRY)
    status_of(409, "Conflict", r.json())
    assert r.json()["details"]["causes"][0]["reason"] == "FieldManagerConflict"
    stale = ops.get(f"{HV}/hv1").json()
    stale["metadata"]["resourceVersion"] = "1" if stale["metadata"]["resourceVersion"] != "1" else "2"
    status_of(409, "Conflict", ops.put(f"{HV}/hv1", params=DRY, json=stale).json())
    status_of(409, "AlreadyExists", ops.post(HV, params=DRY, json=hypervisor("hv1")).json())
    status_of(404, "NotFound", ops.delete(f"{HV}/nope", params=DRY).json())
    r = api.client("sched-token").post(RES, params=DRY, json=reservation("r1", "1", host="nope"))
    status_of(422, "Invalid", r.json())
    # Validation, and a value other than All.
    status_of(400, "BadRequest", ops.post(HV, params={"dryRun": "Bogus"}, json=hypervisor("x")).json())
    bad = hypervisor("hv5")
    bad["spec"]["overcommitt"] = {}
    assert ops.post(HV, params={**DRY, "fieldValidation": "Strict"}, json=bad).status_code in (400, 422)
    assert state(api) == before


def test_writes_that_have_no_dry_run_refuse_one_and_write_nothing(api: Api) -> None:
    """Release, token writes and batches have no dry run: asked for one, they
    answer 400 rather than write while the caller believes nothing happened."""
    ready_host(api, "hv1", cpu="4")
    assert api.client("sched-token").post(RES, json=reservation("r1", "1")).status_code == 201
    c = api.client()
    before = state(api)
    gv = "/apis/hvfleet.io/v1"
    for r in (c.post(f"{gv}/reservations/r1/release", params=DRY),
              c.post(f"{gv}/accesstokens", params=DRY, json={"role": "viewer"}),
              c.delete(f"{gv}/accesstokens/abc", params=DRY),
              c.post(f"{gv}/batch", params=DRY, json={"writes": [
                  {"action": "create", "object": hypervisor("hv2")}]})):
        status_of(400, "BadRequest", r.json())
        assert "dryRun" in r.json()["message"]
    assert state(api) == before


def test_the_audit_line_of_a_dry_run_says_so() -> None:
    line = audit_event(None, Action("patch", "hypervisors", "hv1", dry_run=True), "4", "4", 200, "OK")
    assert line["dryRun"] is True
    assert "dryRun" not in audit_event(None, Action("patch", "hypervisors", "hv1"), "4", "5", 200, "OK")


@pytest.mark.parametrize("version", sorted(KUBECTLS))
def test_kubectl_server_dry_run_of_apply_and_delete(make_api: Callable[..., Api], tmp_path: Path,
                                                    version: str) -> None:
    kubectl = Kubectl(KUBECTLS[version], version, make_api(tls=True, authorizer=RoleAuthorizer()),
                      tmp_path)
    api = kubectl.api
    before = state(api)
    r = kubectl.apply(manifest(tmp_path, "hv1", overcommit={"cpu": 4}), "--dry-run=server")
    assert r.returncode == 0, r.stderr
    assert "hv1" in r.stdout and "(server dry run)" in r.stdout
    assert state(api) == before
    assert kubectl.apply(manifest(tmp_path, "hv1", overcommit={"cpu": 4})).returncode == 0
    before = state(api)
    r = kubectl.apply(manifest(tmp_path, "hv1", overcommit={"cpu": 8}), "--dry-run=server",
                      "-o", "yaml")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["spec"]["overcommit"] == {"cpu": 8}
    assert state(api) == before
    r = kubectl("delete", "hv", "hv1", "--dry-run=server")
    assert r.returncode == 0, r.stderr
    assert "(server dry run)" in r.stdout
    assert state(api) == before
    # Refused as the write would be: a viewer's dry run is Forbidden.
    r = kubectl("delete", "hv", "hv1", "--dry-run=server", token="viewer-token")
    assert r.returncode != 0 and "forbidden" in r.stderr.lower(), (r.stdout, r.stderr)
    assert state(api) == before
