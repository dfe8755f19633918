"""Defaults and error shapes as kube-apiserver answers them: an Invalid Status
names the kind, the object and each bad field; a bad selector is 400; whole
numbers stay integers in JSON; fieldValidation defaults to Warn."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from hvfleet.model.errors import Gone
from hvfleet.model.hypervisor import Resource
from hvfleet.server.identity import Action, Identity
from hvfleet.server.status import Target, from_error
from hvfleet.store import sqlite as sqlite_backend
from tests.server.conftest import Api
from tests.server.objects import HV, hypervisor, status_of
from tests.server.static_auth import AllowAll, RecordingAudit

POLICIES = "/apis/hvfleet.io/v1/overcommitpolicies"


def test_invalid_names_the_kind_the_object_and_each_field(api: Api) -> None:
    r = api.client().post(HV, json=hypervisor("hv9", overcommit={"cpu": 0}, maintenance="sometimes"))
    status_of(422, "Invalid", r.json())
    details = r.json()["details"]
    assert (details["kind"], details["name"], details["group"]) == ("Hypervisor", "hv9", "hvfleet.io")
    causes = {c["field"]: c for c in details["causes"]}
    assert {"spec.overcommit", "spec.maintenance"} <= set(causes)
    assert all(c["reason"] == "FieldValueInvalid" and c["message"] for c in causes.values())
    assert api.store.list("Hypervisor").items == []
    # NotFound keeps naming the resource, as kube does.
    r = api.client().get(f"{HV}/nope")
    assert r.json()["details"]["kind"] == "hypervisors"


def test_bad_selectors_are_400(api: Api) -> None:
    c = api.client()
    for params in ({"labelSelector": "a in"}, {"labelSelector": "=x"}, {"fieldSelector": "spec.x=1"}):
        status_of(400, "BadRequest", c.get(HV, params=params).json())
        status_of(400, "BadRequest", c.get(HV, params={**params, "watch": "true"}).json())
        status_of(400, "BadRequest", c.delete(HV, params=params).json())


def test_whole_numbers_stay_integers_in_json(api: Api) -> None:
    c = api.client()
    r = c.post(HV, json=hypervisor("hv1", overcommit={"cpu": 4, "memory": 1.5}))
    assert r.status_code == 201, r.text
    assert '"overcommit":{"cpu":4,"memory":1.5}' in r.text.replace(" ", "")
    raw = c.get(f"{HV}/hv1").text.replace(" ", "")
    assert '"cpu":4,' in raw and '"cpu":4.0' not in raw
    policy = {"apiVersion": "hvfleet.io/v1", "kind": "OvercommitPolicy", "metadata": {"name": "p"},
              "spec": {"selector": {"matchLabels": {"rack": "a"}}, "overcommit": {"cpu": 2}}}
    r = c.post(POLICIES, json=policy)
    assert r.status_code == 201, r.text
    assert json.loads(r.text)["spec"]["overcommit"] == {"cpu": 2}
    assert '"cpu":2}' in r.text.replace(" ", "")


def test_field_validation_defaults_to_warn_with_a_kubectl_shaped_header(api: Api) -> None:
    doc = hypervisor("hv1")
    doc["spec"]["foo"] = 1
    r = api.client().post(HV, json=doc)
    assert r.status_code == 201, r.text
    assert r.raw.headers.getlist("Warning") == ['299 - "unknown field \\"spec.foo\\""']
    assert "foo" not in r.json()["spec"]
    # A field name outside printable ASCII still gives a valid header.
    doc = hypervisor("hv2")
    doc["spec"]["f\u00f6\u00f6\n"] = 1
    r = api.client().post(HV, json=doc)
    assert r.status_code == 201, r.text
    assert r.raw.headers.getlist("Warning") == ['299 - "unknown field \\"spec.f???\\""']


def test_an_exact_list_reads_the_objects_as_they_were_at_that_version(api: Api) -> None:
    c = api.client()
    c.post(HV, json=hypervisor("hv1"))
    c.post(HV, json=hypervisor("hv2"))
    then = c.get(HV).json()
    rv = then["metadata"]["resourceVersion"]
    c.patch(f"{HV}/hv1", {"metadata": {"labels": {"rack": "b"}}, "spec": {"maintenance": "drain"}})
    c.delete(f"{HV}/hv2")
    c.post(HV, json=hypervisor("hv3"))
    exact = c.get(HV, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"}).json()
    assert exact["metadata"]["resourceVersion"] == rv
    assert exact["items"] == then["items"]
    # With a selector: as the labels were then.
    selected = c.get(HV, params={"resourceVersion": rv, "resourceVersionMatch": "Exact",
                                 "labelSelector": "rack=a"}).json()
    assert [o["metadata"]["name"] for o in selected["items"]] == ["hv1", "hv2"]
    # NotOlderThan (and no match) is the state now.
    now = c.get(HV, params={"resourceVersion": rv, "resourceVersionMatch": "NotOlderThan"}).json()
    assert [o["metadata"]["name"] for o in now["items"]] == ["hv1", "hv3"]
    # Exact at a version not reached yet: 504, as any read past the newest.
    newest = api.store.revision()
    status_of(504, "Timeout", c.get(HV, params={"resourceVersion": str(newest + 5),
                                                "resourceVersionMatch": "Exact"}).json())


def test_an_exact_list_past_the_kept_history_is_410_expired(
        make_api: Callable[..., Api], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_backend, "EVENT_HISTORY", 5)
    monkeypatch.setattr(sqlite_backend, "_COMPACT_EVERY", 5)
    api = make_api()
    c = api.client()
    c.post(HV, json=hypervisor("hv0"))
    rv = c.get(HV).json()["metadata"]["resourceVersion"]
    for i in range(1, 12):
        c.post(HV, json=hypervisor(f"hv{i}"))
    r = c.get(HV, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"})
    status_of(410, "Expired", r.json())
    assert r.json()["message"] == "The resourceVersion for the provided list is too old."
    # A limited list at that version is exact too (kube's legacy rule): 410 alike.
    r = c.get(HV, params={"resourceVersion": rv, "limit": 2})
    status_of(410, "Expired", r.json())


def test_a_compacted_version_answers_without_naming_the_store() -> None:
    """The store's words (its URL: etcd endpoints and key prefix) stay in the
    server's log; any reader gets kube-apiserver's."""
    exc = Gone("store etcd://10.0.0.5:2379/hvfleet-prod: list Hypervisor: revision was compacted")
    body = from_error(exc, Target("hypervisors", "", "Hypervisor"))
    assert (body["code"], body["reason"]) == (410, "Expired")
    assert body["message"] == "The resourceVersion for the provided list is too old."


def test_a_ratio_set_without_validation_still_serializes_as_an_integer() -> None:
    from hvfleet.model.hypervisor import Hypervisor

    h = Hypervisor.model_validate({"metadata": {"name": "hv1"}})
    # model_copy skips validation: the ratio stays the int it was given.
    h = h.model_copy(update={"spec": h.spec.model_copy(update={"overcommit": {"cpu": 4}})})
    assert json.dumps(h.to_dict()["spec"]["overcommit"]) == '{"cpu": 4}'


class _BuggyAuthorizer(AllowAll):
    """An authorizer with a bug: an error class no table knows."""

    def authorize(self, who: Identity, action: Action, current: Resource | None,
                  new: Resource | None) -> None:
        super().authorize(who, action, current, new)
        if action.verb != "get" or action.name != "fine":
            raise RuntimeError("a bug")


def test_an_error_no_table_knows_is_a_500_status_about_the_request(make_api: Callable[..., Api]) -> None:
    # The guard answers it as it answers the core's errors: a Status naming
    # what the request was about (its path, or what the handler said), and the
    # server goes on serving.
    audit = RecordingAudit()
    api = make_api(authorizer=_BuggyAuthorizer(), audit=audit)
    c = api.client()
    for r, details in ((c.get(f"{HV}/hv1"), {"name": "hv1", "group": "hvfleet.io", "kind": "hypervisors"}),
                       (c.post("/apis/hvfleet.io/v1/fit", json={"cpu": "1"}),
                        {"name": "fit", "group": "hvfleet.io"}),
                       (c.post(HV, json=hypervisor("hv2")),
                        {"name": "hv2", "group": "hvfleet.io", "kind": "hypervisors"})):
        assert r.status_code == 500 and r.headers["content-type"] == "application/json", r.text
        body = r.json()
        assert (body["kind"], body["reason"], body["message"]) == (
            "Status", "InternalError", "internal error: RuntimeError")
        assert body["details"] == details
    # The refused write has its one audit line, with the code it was answered.
    assert [(e.action.verb, e.code, e.reason) for e in audit.records] == [("create", 500, "InternalError")]
    assert c.get(f"{HV}/fine").status_code == 404
