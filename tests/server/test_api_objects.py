"""Objects over HTTP: create, get, replace (CAS), delete with preconditions,
merge patch, server-side apply with conflicts, /status, and every error as a
meta/v1 Status — against a real uvicorn server over a real SQLite store."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml

from tests.server.conftest import Api
from tests.server.objects import HV, hypervisor, status_of
from tests.server.static_auth import ReadOnly, RecordingAudit


def test_create_get_and_kubernetes_shaped_errors(api: Api) -> None:
    c = api.client()
    r = c.post(HV, json=hypervisor(overcommit={"cpu": 4}))
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["metadata"]["uid"] and made["metadata"]["resourceVersion"]
    # The field manager is the caller's identity, not the fieldManager it asked for.
    assert [e["manager"] for e in made["metadata"]["managedFields"]] == ["ops"]

    got = c.get(f"{HV}/hv1").json()
    assert got["spec"]["overcommit"] == {"cpu": 4.0}

    r = c.post(HV + "?fieldManager=someone-else", json=hypervisor())
    status_of(409, "AlreadyExists", r.json())
    assert r.json()["message"] == 'hypervisors.hvfleet.io "hv1" already exists'

    r = c.get(f"{HV}/nope")
    status_of(404, "NotFound", r.json())
    assert r.json()["message"] == 'hypervisors.hvfleet.io "nope" not found'
    assert r.json()["details"] == {"name": "nope", "group": "hvfleet.io", "kind": "hypervisors"}

    status_of(404, "NotFound", c.get("/apis/hvfleet.io/v1/widgets").json())
    status_of(401, "Unauthorized", api.client(None).get(f"{HV}/hv1").json())
    status_of(401, "Unauthorized", api.client("wrong").get(HV).json())


def test_strict_decoding_refuses_unknown_fields_by_path_and_writes_nothing(api: Api) -> None:
    c = api.client()
    doc = hypervisor(overcommit={"cpu": 2})
    doc["spec"]["overcommitt"] = {"cpu": 3}
    doc["metadata"]["colour"] = "blue"
    r = c.post(HV + "?fieldValidation=Strict", json=doc)
    status_of(400, "BadRequest", r.json())
    fields = sorted(cause["field"] for cause in r.json()["details"]["causes"])
    assert fields == ["metadata.colour", "spec.overcommitt"]
    assert 'unknown field "spec.overcommitt"' in r.json()["message"]
    assert api.store.list("Hypervisor").items == []

    # Warn, the default as in kube-apiserver, drops them and says so in one
    # well-formed Warning header each; Ignore drops them silently.
    r = c.post(HV, json=doc)
    assert r.status_code == 201, r.text
    # One Warning header, one 299 value per warning (RFC 7234: comma separated).
    assert r.headers["Warning"] == ('299 - "unknown field \\"metadata.colour\\"", '
                                    '299 - "unknown field \\"spec.overcommitt\\""')
    assert "overcommitt" not in r.json()["spec"]


def test_thousands_of_warnings_stay_in_a_header_every_client_reads(api: Api) -> None:
    """2,500 unknown fields under Warn made a Warning header past 64 KiB:
    requests (and the official Python client over urllib3) failed with
    LineTooLong though the object was created, and a retry met AlreadyExists.
    The header is bounded as kube-apiserver bounds it (4 KiB)."""
    c = api.client()
    doc = hypervisor("many")
    doc["spec"].update({f"unknown{i:04d}": i for i in range(2500)})
    r = c.post(HV, json=doc)
    assert r.status_code == 201, r.text
    header = r.headers["Warning"]
    assert len(header) <= 4096 and header.startswith('299 - "unknown field')
    assert header.endswith(' more warnings not shown"')
    assert c.get(f"{HV}/many").status_code == 200


def test_an_empty_dry_run_value_is_refused_not_written(api: Api) -> None:
    c = api.client()
    status_of(400, "BadRequest", c.post(HV, params={"dryRun": ""}, json=hypervisor("dry")).json())
    assert c.get(f"{HV}/dry").status_code == 404


def test_invalid_values_are_422_with_field_causes(api: Api) -> None:
    c = api.client()
    r = c.post(HV, json=hypervisor(overcommit={"cpu": 0}, maintenance="sometimes"))
    status_of(422, "Invalid", r.json())
    fields = {cause["field"] for cause in r.json()["details"]["causes"]}
    assert {"spec.overcommit", "spec.maintenance"} <= fields
    assert r.json()["message"].startswith('Hypervisor.hvfleet.io "hv1" is invalid: ')
    r = c.post(HV, json={**hypervisor(), "kind": "Reservation"})
    status_of(400, "BadRequest", r.json())
    r = c.post(HV, data=b"{not json", headers={"Content-Type": "application/json"})
    status_of(400, "BadRequest", r.json())
    r = c.post(HV, data=b'{"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": "hv1",'
                        b' "annotations": {"a": "\\ud800"}}}', headers={"Content-Type": "application/json"})
    status_of(400, "BadRequest", r.json())
    assert api.store.list("Hypervisor").items == []


def test_body_larger_than_the_limit_is_413_and_writes_nothing(api: Api) -> None:
    c = api.client()
    doc = hypervisor()
    doc["metadata"]["annotations"] = {"big": "x" * (1024 * 1024)}
    r = c.post(HV, json=doc)
    status_of(413, "RequestEntityTooLarge", r.json())
    # Without a Content-Length (chunked upload) the limit holds as well.
    r = c.post(HV, data=iter([json.dumps(doc).encode()]), headers={"Content-Type": "application/json"})
    status_of(413, "RequestEntityTooLarge", r.json())
    assert api.store.list("Hypervisor").items == []


def test_put_is_compare_and_swap_on_resource_version(api: Api) -> None:
    c = api.client()
    made = c.post(HV, json=hypervisor(overcommit={"cpu": 2})).json()
    first = {**made, "spec": {"overcommit": {"cpu": 3}}}
    r = c.put(f"{HV}/hv1", json=first)
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["overcommit"] == {"cpu": 3.0}
    assert r.json()["metadata"]["generation"] == 2
    # The same old version again: stale.
    r = c.put(f"{HV}/hv1", json={**made, "spec": {"overcommit": {"cpu": 5}}})
    status_of(409, "Conflict", r.json())
    assert r.json()["message"].startswith('Operation cannot be fulfilled on hypervisors.hvfleet.io "hv1"')
    # No version at all: refused, nothing written.
    stale = {**made, "metadata": {k: v for k, v in made["metadata"].items() if k != "resourceVersion"}}
    status_of(422, "Invalid", c.put(f"{HV}/hv1", json=stale).json())
    r = c.put(f"{HV}/hv2", json={**first, "metadata": {**first["metadata"], "name": "hv3"}})
    status_of(400, "BadRequest", r.json())
    status_of(404, "NotFound", c.put(f"{HV}/hv2", json={**first, "metadata": {**first["metadata"],
                                                                             "name": "hv2"}}).json())
    assert api.store.get_hypervisor("hv1").spec.overcommit == {"cpu": 3.0}
    # A body naming another object's uid (this name deleted and made again): 409.
    current = c.get(f"{HV}/hv1").json()
    other = {**current, "metadata": {**current["metadata"], "uid": "0b6c1b52-uid-of-another"},
             "spec": {"overcommit": {"cpu": 7}}}
    r = c.put(f"{HV}/hv1", json=other)
    status_of(409, "Conflict", r.json())
    assert r.json()["message"] == (
        'Operation cannot be fulfilled on hypervisors.hvfleet.io "hv1": Precondition failed: '
        f'UID in precondition: 0b6c1b52-uid-of-another, UID in object meta: {current["metadata"]["uid"]}')
    # Not a stale write: no resourceVersion cause (a client retries only those).
    assert "causes" not in r.json()["details"]
    assert api.store.get_hypervisor("hv1").spec.overcommit == {"cpu": 3.0}


def test_delete_with_preconditions(api: Api) -> None:
    c = api.client()
    made = c.post(HV, json=hypervisor()).json()
    rv, uid = made["metadata"]["resourceVersion"], made["metadata"]["uid"]
    c.patch(f"{HV}/hv1", {"metadata": {"labels": {"rack": "b"}}})
    r = c.delete(f"{HV}/hv1", json={"kind": "DeleteOptions", "apiVersion": "v1",
                                    "preconditions": {"resourceVersion": rv}})
    status_of(409, "Conflict", r.json())
    assert r.json()["details"]["causes"][0]["field"] == "metadata.resourceVersion"  # stale
    r = c.delete(f"{HV}/hv1", json={"preconditions": {"uid": "not-the-uid"}})
    status_of(409, "Conflict", r.json())
    assert r.json()["message"] == (
        'Operation cannot be fulfilled on hypervisors.hvfleet.io "hv1": Precondition failed: '
        f"UID in precondition: not-the-uid, UID in object meta: {uid}")
    assert "causes" not in r.json()["details"]  # not a stale write
    assert api.store.get("Hypervisor", "hv1")
    r = c.delete(f"{HV}/hv1", json={"preconditions": {"uid": uid}, "propagationPolicy": "Background"})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["name"] == "hv1"
    status_of(404, "NotFound", c.get(f"{HV}/hv1").json())
    status_of(404, "NotFound", c.delete(f"{HV}/hv1").json())


def test_merge_patch_writes_as_the_caller_and_leaves_status_alone(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor(overcommit={"cpu": 2, "memory": 1.5}))
    r = c.patch(f"{HV}/hv1", {"spec": {"overcommit": {"memory": None, "cpu": 4}},
                              "status": {"capacity": {"cpu": "64"}}})
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["overcommit"] == {"cpu": 4.0}
    assert r.json()["status"].get("capacity", {}) == {}
    # Another operator patching a field ops owns: an Update, which succeeds and
    # takes the field, as in Kubernetes (conflicts are for apply).
    r = api.client("ops2-token").patch(f"{HV}/hv1", {"spec": {"overcommit": {"cpu": 8}}})
    assert r.status_code == 200, r.text
    owners = {(e["manager"], e["operation"]): e["fieldsV1"] for e in r.json()["metadata"]["managedFields"]}
    assert owners[("ops2", "Update")] == {"f:spec": {"f:overcommit": {"f:cpu": {}}}}
    assert "f:spec" not in owners[("ops", "Update")]
    # ops applying another value now conflicts, naming the new owner.
    r = c.patch(f"{HV}/hv1", json.dumps({**hypervisor(overcommit={"cpu": 4})}),
                "application/apply-patch+yaml")
    status_of(409, "Conflict", r.json())
    assert r.json()["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "ops2"', "field": ".spec.overcommit.cpu"}
    ]
    # A patch naming a stale version is a Conflict, not retried.
    r = c.patch(f"{HV}/hv1", {"metadata": {"resourceVersion": "1"}, "spec": {"maintenanceReason": "x"}})
    status_of(409, "Conflict", r.json())


def test_json_patch(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor(overcommit={"cpu": 2}))
    ops = [{"op": "test", "path": "/spec/overcommit/cpu", "value": 2},
           {"op": "add", "path": "/spec/overcommit/memory", "value": 1.5},
           {"op": "replace", "path": "/spec/overcommit/cpu", "value": 3},
           {"op": "add", "path": "/metadata/labels/a~1b", "value": "x"},
           {"op": "move", "from": "/metadata/labels/rack", "path": "/metadata/labels/row"}]
    r = c.patch(f"{HV}/hv1", ops, "application/json-patch+json")
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["overcommit"] == {"cpu": 3.0, "memory": 1.5}
    assert r.json()["metadata"]["labels"] == {"a/b": "x", "row": "a"}
    before = api.store.get("Hypervisor", "hv1").metadata.resource_version
    failed = c.patch(f"{HV}/hv1", [{"op": "test", "path": "/spec/overcommit/cpu", "value": 9},
                                   {"op": "remove", "path": "/spec/overcommit"}],
                     "application/json-patch+json")
    status_of(422, "Invalid", failed.json())
    # Why it did not apply is the Status's cause, which kubectl prints.
    assert failed.json()["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": "test of '/spec/overcommit/cpu' failed",
         "field": "patch"}]
    missing = c.patch(f"{HV}/hv1", [{"op": "remove", "path": "/spec/nothing"}],
                      "application/json-patch+json").json()
    status_of(422, "Invalid", missing)
    assert [c["message"] for c in missing["details"]["causes"]] == ["path '/spec/nothing' does not exist"]
    status_of(400, "BadRequest", c.patch(f"{HV}/hv1", {"op": "add"}, "application/json-patch+json").json())
    assert api.store.get("Hypervisor", "hv1").metadata.resource_version == before


def test_strategic_merge_patch_and_other_types_are_415(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor())
    r = c.patch(f"{HV}/hv1", {"spec": {}}, "application/strategic-merge-patch+json")
    status_of(415, "UnsupportedMediaType", r.json())
    r = c.patch(f"{HV}/hv1", "spec: {}", "text/plain")
    status_of(415, "UnsupportedMediaType", r.json())


def apply_doc(**spec: Any) -> str:
    return yaml.safe_dump(hypervisor(**spec))


def test_server_side_apply_creates_merges_by_owner_and_conflicts_with_causes(api: Api) -> None:
    ops, ops2 = api.client(), api.client("ops2-token")
    apply = "application/apply-patch+yaml"
    r = ops.patch(f"{HV}/hv1?fieldManager=kubectl", apply_doc(overcommit={"cpu": 4}), apply)
    assert r.status_code == 201, r.text
    r = ops2.patch(f"{HV}/hv1?fieldManager=kubectl", apply_doc(reserved={"memory": "2Gi"}), apply)
    assert r.status_code == 200, r.text
    # Both managers' fields are kept: each applied only its own.
    assert r.json()["spec"]["overcommit"] == {"cpu": 4.0}
    assert r.json()["spec"]["reserved"] == {"memory": "2Gi"}
    managers = {e["manager"] for e in r.json()["metadata"]["managedFields"]}
    assert managers == {"ops", "ops2"}

    r = ops2.patch(f"{HV}/hv1", apply_doc(reserved={"memory": "2Gi"}, overcommit={"cpu": 2}), apply)
    status_of(409, "Conflict", r.json())
    assert r.json()["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "ops"', "field": ".spec.overcommit.cpu"}
    ]
    assert api.store.get_hypervisor("hv1").spec.overcommit == {"cpu": 4.0}
    r = ops2.patch(f"{HV}/hv1?force=true", apply_doc(reserved={"memory": "2Gi"}, overcommit={"cpu": 2}),
                   apply)
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["overcommit"] == {"cpu": 2.0}
    # Dropping a field from one's own manifest removes it (ops no longer owns anything).
    r = ops2.patch(f"{HV}/hv1", apply_doc(overcommit={"cpu": 2}), apply)
    assert "reserved" not in r.json()["spec"] or r.json()["spec"]["reserved"] == {}
    # Strict decoding applies to apply bodies too.
    bad = apply_doc(overcommit={"cpu": 2}).replace("spec:", "spec:\n  bogus: 1")
    r = ops2.patch(f"{HV}/hv1?fieldValidation=Strict", bad, apply)
    status_of(400, "BadRequest", r.json())
    assert r.json()["details"]["causes"][0]["field"] == "spec.bogus"


def test_an_apply_of_a_field_at_its_zero_value_is_a_value(api: Api) -> None:
    """`maintenance: ""` in an apply was read as "not named": it neither
    conflicted with the manager that set `drain` nor, forced, cleared it
    (`kubectl apply --server-side --force-conflicts` could not take a host
    out of maintenance, and said it had). As in kube-apiserver it is a value:
    a conflict with that manager, and with force the field takes it."""
    ops, ops2 = api.client(), api.client("ops2-token")
    apply = "application/apply-patch+yaml"
    assert ops.patch(f"{HV}/hv1", apply_doc(overcommit={"cpu": 4}), apply).status_code == 201
    assert ops2.patch(f"{HV}/hv1", {"spec": {"maintenance": "drain", "maintenanceReason": "disks"}}
                      ).status_code == 200
    cleared = apply_doc(overcommit={"cpu": 4}, maintenance="", maintenanceReason="")
    r = ops.patch(f"{HV}/hv1", cleared, apply)
    status_of(409, "Conflict", r.json())
    assert {c["field"] for c in r.json()["details"]["causes"]} == {".spec.maintenance",
                                                                  ".spec.maintenanceReason"}
    assert api.store.get_hypervisor("hv1").spec.maintenance == "drain"
    r = ops.patch(f"{HV}/hv1?force=true", cleared, apply)
    assert r.status_code == 200, r.text
    spec = r.json()["spec"]
    assert spec.get("maintenance", "") == "" and spec.get("maintenanceReason", "") == ""
    assert api.store.get_hypervisor("hv1").spec.maintenance == ""
    # Applied again unchanged: no write.
    version = r.json()["metadata"]["resourceVersion"]
    again = ops.patch(f"{HV}/hv1", cleared, apply)
    assert again.status_code == 200 and again.json()["metadata"]["resourceVersion"] == version


POLICIES = "/apis/hvfleet.io/v1/overcommitpolicies"


def test_an_apply_naming_an_unknown_field_applies_again_as_it_applied_first(api: Api) -> None:
    """kube-apiserver drops an unknown field of an apply under fieldValidation
    Warn (the default: with a warning) or Ignore, and fails under Strict, the
    same on the create and on every apply after. hvfleet created the object,
    then answered every re-apply 400 ("name the field as the API spells it")."""
    ops = api.client()
    apply = "application/apply-patch+yaml"
    doc = {"apiVersion": "hvfleet.io/v1", "kind": "OvercommitPolicy", "metadata": {"name": "unk"},
           "spec": {"overcommit": {"cpu": 2}, "futureField": {"deep": 1}}}
    for validation, code in (("Warn", 201), ("Warn", 200), ("Ignore", 200), ("", 200)):
        query = f"?fieldValidation={validation}" if validation else ""
        r = ops.patch(f"{POLICIES}/unk{query}", json.dumps(doc), apply)
        assert r.status_code == code, (validation, r.text)
        assert "futureField" not in r.json()["spec"]
        assert ("futureField" in r.headers.get("Warning", "")) == (validation != "Ignore")
        owned = [e["fieldsV1"] for e in r.json()["metadata"]["managedFields"] if e["operation"] == "Apply"]
        assert owned and all("f:futureField" not in e.get("f:spec", {}) for e in owned)
    r = ops.patch(f"{POLICIES}/unk?fieldValidation=Strict", json.dumps(doc), apply)
    status_of(400, "BadRequest", r.json())
    assert "futureField" in r.json()["message"]


def test_a_partial_apply_configuration_is_merged_onto_the_stored_object(api: Api) -> None:
    """kube-apiserver takes an apply configuration that names only what its
    manager manages; hvfleet validated it as a whole object (422
    "spec: Field required" for a policy's labels, "spec.overcommit: Field
    required" for its priority, and a /status apply naming conditions only
    emptied the rest of the status)."""
    ops, ops2, agent = api.client(), api.client("ops2-token"), api.client("agent-hv1-token")
    apply = "application/apply-patch+yaml"
    policy = {"apiVersion": "hvfleet.io/v1", "kind": "OvercommitPolicy", "metadata": {"name": "p"},
              "spec": {"overcommit": {"cpu": 2}}}
    assert ops.patch(f"{POLICIES}/p", json.dumps(policy), apply).status_code == 201
    labels_only = {"apiVersion": "hvfleet.io/v1", "kind": "OvercommitPolicy",
                   "metadata": {"name": "p", "labels": {"team": "a"}}}
    r = ops2.patch(f"{POLICIES}/p", json.dumps(labels_only), apply)
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["labels"] == {"team": "a"} and r.json()["spec"]["overcommit"] == {"cpu": 2.0}
    priority_only = {**labels_only, "spec": {"priority": 5}}
    r = ops2.patch(f"{POLICIES}/p", json.dumps(priority_only), apply)
    assert r.status_code == 200, r.text
    assert r.json()["spec"] == {**r.json()["spec"], "priority": 5, "overcommit": {"cpu": 2.0}}
    owners = {e["manager"]: e["fieldsV1"] for e in r.json()["metadata"]["managedFields"]
              if e["operation"] == "Apply"}
    assert "f:priority" in owners["ops2"]["f:spec"] and "f:overcommit" not in owners["ops2"]["f:spec"]
    # A field spelled otherwise than the API spells it is an unknown field, as in
    # kube: dropped with a warning (fieldValidation Warn), owned by nobody, refused
    # under Strict.
    snake = {**labels_only, "spec": {"priority": 5, "selector": {"match_labels": {"az": "a"}}}}
    r = ops2.patch(f"{POLICIES}/p", json.dumps(snake), apply)
    assert r.status_code == 200 and "spec.selector.match_labels" in r.headers["Warning"], r.text
    assert r.json()["spec"]["selector"]["matchLabels"] == {}
    r = ops2.patch(f"{POLICIES}/p?fieldValidation=Strict", json.dumps(snake), apply)
    status_of(400, "BadRequest", r.json())
    assert "match_labels" in r.json()["message"]

    # /status: the conditions the agent applies; capacity and heartbeat stay.
    made = ops.post(HV, json=hypervisor(overcommit={"cpu": 2})).json()
    status = {"capacity": {"cpu": "16", "memory": "64Gi"}, "lastHeartbeatTime": "2026-01-01T00:00:00Z"}
    assert agent.put(f"{HV}/hv1/status", json={**made, "status": status}).status_code == 200
    conditions = {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": "hv1"},
                  "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "AgentReady"}]}}
    r = agent.patch(f"{HV}/hv1/status", json.dumps(conditions), apply)
    assert r.status_code == 200, r.text
    got = r.json()["status"]
    assert got["capacity"] == {"cpu": "16", "memory": "64Gi"} and got["lastHeartbeatTime"]
    assert [c["type"] for c in got["conditions"]] == ["Ready"]


def test_an_apply_adds_the_finalizers_and_owners_it_names_to_a_stored_object(api: Api) -> None:
    """They were taken only when the apply created the object, and dropped
    silently (200, nothing stored) when it existed."""
    ops = api.client()
    apply = "application/apply-patch+yaml"
    owner = ops.post(HV, json=hypervisor("owner")).json()
    assert ops.patch(f"{HV}/hv1", apply_doc(overcommit={"cpu": 2}), apply).status_code == 201
    doc = yaml.safe_load(apply_doc(overcommit={"cpu": 2}))
    doc["metadata"]["finalizers"] = ["example.com/keep"]
    doc["metadata"]["ownerReferences"] = [{"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
                                           "name": "owner", "uid": owner["metadata"]["uid"]}]
    r = ops.patch(f"{HV}/hv1", yaml.safe_dump(doc), apply)
    assert r.status_code == 200, r.text
    stored = api.store.get_hypervisor("hv1").metadata
    assert stored.finalizers == ["example.com/keep"]
    assert [o.name for o in stored.owner_references or []] == ["owner"]


def test_managed_fields_in_a_request_are_not_read(api: Api) -> None:
    """kube's `{"metadata":{"managedFields":[{}]}}` (clear them) was a 422
    "manager: Field required"; hvfleet records ownership from identities and
    reads none from a request: taken, and the entries stay."""
    ops, ops2 = api.client(), api.client("ops2-token")
    apply = "application/apply-patch+yaml"
    assert ops.patch(f"{HV}/hv1", apply_doc(overcommit={"cpu": 4}), apply).status_code == 201
    r = ops2.patch(f"{HV}/hv1", {"metadata": {"managedFields": [{}]}})
    assert r.status_code == 200, r.text
    assert {e["manager"] for e in r.json()["metadata"]["managedFields"]} == {"ops"}
    r = ops2.patch(f"{HV}/hv1", apply_doc(overcommit={"cpu": 2}), apply)
    status_of(409, "Conflict", r.json())  # still ops's


def test_digits_int_refuses_are_a_4xx_not_a_500(api: Api) -> None:
    """str.isdigit() takes '²', which int() then refuses: a JSON patch index
    or a resourceVersion spelled so was a 500 (and a dashboard count, a
    libvirt capabilities file of a caps dir, a --listen port)."""
    c = api.client()
    made = c.post(HV, json=hypervisor()).json()
    patch = [{"op": "add", "path": "/metadata/finalizers", "value": ["a"]},
             {"op": "add", "path": "/metadata/finalizers/²", "value": "b"}]
    r = c.patch(f"{HV}/hv1", json.dumps(patch), "application/json-patch+json")
    assert 400 <= r.status_code < 500, r.text
    r = c.put(f"{HV}/hv1", json={**made, "metadata": {**made["metadata"], "resourceVersion": "²"}})
    assert 400 <= r.status_code < 500, r.text
    assert api.store.get_hypervisor("hv1").metadata.finalizers is None


def test_status_subresource_get_put_patch(api: Api) -> None:
    ops, agent = api.client(), api.client("agent-hv1-token")
    made = ops.post(HV, json=hypervisor(overcommit={"cpu": 2})).json()
    status = {"capacity": {"cpu": "16", "memory": "64Gi"}, "allocation": {"cpu": "2"},
              "conditions": [{"type": "Ready", "status": "True", "reason": "AgentReady"}]}
    r = agent.put(f"{HV}/hv1/status", json={**made, "status": status, "spec": {"overcommit": {"cpu": 9}}})
    assert r.status_code == 200, r.text
    # /status writes status only: the spec in the body is ignored.
    assert r.json()["spec"]["overcommit"] == {"cpu": 2.0}
    assert r.json()["status"]["capacity"] == {"cpu": "16", "memory": "64Gi"}
    r = agent.patch(f"{HV}/hv1/status", {"status": {"allocation": {"cpu": "4"}}})
    assert r.status_code == 200, r.text
    assert r.json()["status"]["allocation"] == {"cpu": "4"}
    assert agent.get(f"{HV}/hv1/status").json()["status"]["allocation"] == {"cpu": "4"}
    # The store's rule holds under any authorizer: only agent/hv1 writes hv1's status.
    r = ops.patch(f"{HV}/hv1/status", {"status": {"allocation": {"cpu": "1"}}})
    status_of(403, "Forbidden", r.json())
    assert api.store.get_hypervisor("hv1").status.allocation["cpu"] == 4


def test_every_handler_asks_the_authorizer_before_writing(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor())
    c.patch(f"{HV}/hv1", {"spec": {"maintenance": "drain"}})
    c.get(HV)
    c.delete(f"{HV}/hv1")
    asked = [(a.verb, a.name, cur is not None, new is not None) for _, a, cur, new in api.authorizer.asked]
    # A write is asked about twice: before the store is read (no objects), then
    # with the stored and the new object, just before the write.
    assert asked == [("create", "hv1", False, True),
                     ("patch", "hv1", False, False), ("patch", "hv1", True, True),
                     ("list", None, False, False),
                     ("delete", "hv1", False, False), ("delete", "hv1", True, False)]
    who, _, current, new = api.authorizer.asked[2]
    assert who.subject == "ops" and current is not None and new is not None
    assert new.spec.maintenance == "drain" and current.spec.maintenance == ""


def test_every_write_is_audited_once_whatever_its_result(make_api: Callable[..., Api]) -> None:
    audit = RecordingAudit()
    api = make_api(audit=audit)
    c = api.client()
    made = c.post(HV, json=hypervisor()).json()
    c.patch(f"{HV}/hv1", {"spec": {"maintenance": "drain"}})
    apply = {**hypervisor(), "spec": {"maintenance": "manual", "maintenanceReason": "x"}}
    api.client("ops2-token").patch(f"{HV}/hv1", json.dumps(apply),  # ops owns it: 409
                                   "application/apply-patch+yaml")
    api.client(None).delete(f"{HV}/hv1")  # no token: 401
    c.get(HV)  # reads are not audited
    c.delete(f"{HV}/hv1")
    got = [(r.who.subject if r.who else None, r.action.verb, r.action.name, r.before, r.after, r.code)
           for r in audit.records]
    rv1 = made["metadata"]["resourceVersion"]
    rv2 = str(int(rv1) + 1)
    assert got == [
        ("ops", "create", "hv1", None, rv1, 201),
        ("ops", "patch", "hv1", rv1, rv2, 200),
        ("ops2", "patch", "hv1", rv2, None, 409),
        (None, "delete", "hv1", None, None, 401),
        ("ops", "delete", "hv1", rv2, None, 200),
    ]


def test_a_refused_write_is_403_before_the_store_is_read(make_api: Callable[..., Api]) -> None:
    audit = RecordingAudit()
    api = make_api(authorizer=ReadOnly(), audit=audit)
    c = api.client("viewer-token")
    # Forbidden whether or not the object exists: the refusal tells nothing about it.
    for path in (f"{HV}/hv1", f"{HV}/absent"):
        status_of(403, "Forbidden", c.patch(path, {"spec": {"maintenance": "drain"}}).json())
        status_of(403, "Forbidden", c.delete(path).json())
        status_of(403, "Forbidden", c.put(path, json={**hypervisor(path.rsplit("/", 1)[1]),
                                                      "metadata": {"name": path.rsplit("/", 1)[1],
                                                                   "resourceVersion": "1"}}).json())
    status_of(403, "Forbidden", c.post(HV, json=hypervisor("hv2")).json())
    assert api.store.list("Hypervisor").items == []
    assert {r.code for r in audit.records} == {403} and len(audit.records) == 7


def test_batch_writes_all_or_nothing(make_api: Callable[..., Api]) -> None:
    audit = RecordingAudit()
    api = make_api(audit=audit)
    c = api.client()
    made = c.post(HV, json=hypervisor("hv1")).json()
    batch = "/apis/hvfleet.io/v1/batch"
    update = {**made, "spec": {"maintenance": "drain"}}
    r = c.post(batch, json={"writes": [{"action": "create", "object": hypervisor("hv2")},
                                       {"action": "update", "object": update}]})
    assert r.status_code == 200, r.text
    assert [o["metadata"]["name"] for o in r.json()["items"]] == ["hv2", "hv1"]
    assert api.store.get_hypervisor("hv1").spec.maintenance == "drain"
    # The same update again is stale: nothing of the batch is written.
    r = c.post(batch, json={"writes": [{"action": "create", "object": hypervisor("hv3")},
                                       {"action": "update", "object": update}]})
    status_of(409, "Conflict", r.json())
    assert [h.name for h in api.store.list_hypervisors()] == ["hv1", "hv2"]
    # Strict decoding names the write.
    bad = hypervisor("hv4", bogus=1)
    r = c.post(batch, json={"writes": [{"action": "create", "object": bad}]})
    status_of(400, "BadRequest", r.json())
    assert r.json()["details"]["causes"][0]["field"] == "writes[0].object.spec.bogus"
    r = c.post(batch, json={"writes": [{"action": "create", "object": {
        "apiVersion": "hvfleet.io/v1", "kind": "Reservation", "metadata": {"name": "r1"},
        "spec": {"hypervisor": "hv1", "resources": {"cpu": "1"}, "consumer": "c"}}}]})
    status_of(422, "Invalid", r.json())
    assert r.json()["details"]["causes"][0]["field"] == "writes[0]"
    assert [(a.action.verb, a.code) for a in audit.records][1:] == [
        ("create", 201), ("update", 200), ("create", 409), ("update", 409)]


def test_batch_writes_are_authorized_each(make_api: Callable[..., Api]) -> None:
    api = make_api(authorizer=ReadOnly())
    r = api.client("viewer-token").post("/apis/hvfleet.io/v1/batch", json={
        "writes": [{"action": "create", "object": hypervisor("hv1")}]})
    status_of(403, "Forbidden", r.json())
    assert api.store.list("Hypervisor").items == []
