"""The answer's form from `Accept`, as kube-apiserver negotiates it for custom
resources: JSON or YAML; a Table, a PartialObjectMetadata or a
PartialObjectMetadataList in meta.k8s.io v1 or v1beta1; clauses it cannot
serve passed over (protobuf, another `as`); 406 NotAcceptable, before anything
is written, when none can be served; a Table's includeObject checked."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hvfleet.server.negotiation import JSON, SERVED, YAML, negotiate
from hvfleet.server.status import ApiError
from tests.server.conftest import Api
from tests.server.objects import HV, hypervisor
from tests.server.watching import Watcher

PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
PARTIAL = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
# What client-go's metadata client (informers of metadata only, the garbage
# collector, `kubectl` plugins) sends.
METADATA_CLIENT = ("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
                   "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
                   "application/json")


def _labelled(name: str, **labels: str) -> dict[str, Any]:
    doc = hypervisor(name)
    doc["metadata"]["labels"] = labels
    return doc


def _fleet(api: Api, *names: str) -> Any:
    c = api.client()
    for n in names:
        assert c.post(HV, json=_labelled(n, zone="a")).status_code == 201
    return c


def _patch(c: Any, path: str, body: dict[str, Any], accept: str) -> Any:
    return c.call("PATCH", path, data=json.dumps(body),
                  headers={"Content-Type": "application/merge-patch+json", "Accept": accept})


def _not_acceptable(r: Any) -> dict[str, Any]:
    assert r.status_code == 406, r.text
    body: dict[str, Any] = r.json()
    assert body["kind"] == "Status" and body["reason"] == "NotAcceptable", body
    return body


def test_a_list_as_partial_object_metadata_list_carries_metadata_only(api: Api) -> None:
    c = _fleet(api, "hv0", "hv1", "hv2")
    full = c.get(HV).json()
    for accept in (PARTIAL_LIST, METADATA_CLIENT):
        r = c.get(HV, headers={"Accept": accept})
        assert r.status_code == 200 and r.headers["content-type"] == JSON, r.text
        doc = r.json()
        assert doc["kind"] == "PartialObjectMetadataList" and doc["apiVersion"] == "meta.k8s.io/v1"
        assert doc["metadata"]["resourceVersion"] == full["metadata"]["resourceVersion"]
        assert [i["metadata"] for i in doc["items"]] == [i["metadata"] for i in full["items"]]
        assert {tuple(sorted(i)) for i in doc["items"]} == {("apiVersion", "kind", "metadata")}
        assert {i["kind"] for i in doc["items"]} == {"PartialObjectMetadata"}
    # Pages keep their continue token and count.
    page = c.get(HV, params={"limit": "2"}, headers={"Accept": PARTIAL_LIST}).json()
    assert [i["metadata"]["name"] for i in page["items"]] == ["hv0", "hv1"]
    assert page["metadata"]["remainingItemCount"] == 1 and page["metadata"]["continue"]
    rest = c.get(HV, params={"limit": "2", "continue": page["metadata"]["continue"]},
                 headers={"Accept": PARTIAL_LIST}).json()
    assert [i["metadata"]["name"] for i in rest["items"]] == ["hv2"]
    # v1beta1 as asked.
    beta = c.get(HV, headers={"Accept": PARTIAL_LIST.replace("v=v1", "v=v1beta1")}).json()
    assert beta["apiVersion"] == "meta.k8s.io/v1beta1"
    assert beta["items"][0]["apiVersion"] == "meta.k8s.io/v1beta1"


def test_one_object_as_partial_object_metadata_and_the_mismatches_are_406(api: Api) -> None:
    c = _fleet(api, "hv0")
    full = c.get(f"{HV}/hv0").json()
    doc = c.get(f"{HV}/hv0", headers={"Accept": PARTIAL}).json()
    assert doc == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": full["metadata"]}
    assert "is not a list" in _not_acceptable(
        c.get(f"{HV}/hv0", headers={"Accept": PARTIAL_LIST}))["message"]
    assert "is a list" in _not_acceptable(c.get(HV, headers={"Accept": PARTIAL}))["message"]
    # A write's answer takes the negotiated form too.
    r = _patch(c, f"{HV}/hv0", {"metadata": {"labels": {"x": "y"}}}, PARTIAL)
    assert r.status_code == 200 and r.json()["kind"] == "PartialObjectMetadata", r.text
    assert r.json()["metadata"]["labels"]["x"] == "y"


@pytest.mark.parametrize("accept", ["text/plain", "application/vnd.kubernetes.protobuf",
                                    "application/json;as=Foo;g=meta.k8s.io;v=v1",
                                    "application/json;as=Table;g=meta.k8s.io;v=v2",
                                    "application/json;as=Table;g=example.com;v=v1",
                                    "application/json;q=0", "image/png, text/html"])
def test_an_accept_nothing_can_answer_is_406_and_writes_nothing(api: Api, accept: str) -> None:
    c = _fleet(api, "hv0")
    before = api.store.revision()
    body = _not_acceptable(c.get(HV, headers={"Accept": accept}))
    assert "application/json" in body["message"] and "application/yaml" in body["message"]
    _not_acceptable(c.get(f"{HV}/hv0", headers={"Accept": accept}))
    _not_acceptable(c.post(HV, json=hypervisor("hv9"), headers={"Accept": accept}))
    _not_acceptable(_patch(c, f"{HV}/hv0", {"spec": {"maintenance": "drain"}}, accept))
    _not_acceptable(c.delete(f"{HV}/hv0", headers={"Accept": accept}))
    assert api.store.revision() == before
    assert [h.metadata.name for h in api.store.list_hypervisors()] == ["hv0"]
    assert api.store.get("Hypervisor", "hv0").spec.maintenance == ""


def test_clauses_it_cannot_serve_are_passed_over_in_q_order(api: Api) -> None:
    c = _fleet(api, "hv0")
    r = c.get(f"{HV}/hv0", headers={"Accept": "application/vnd.kubernetes.protobuf, application/json"})
    assert r.status_code == 200 and r.json()["kind"] == "Hypervisor"
    r = c.get(f"{HV}/hv0", headers={"Accept": "application/yaml;q=0.5, application/json"})
    assert r.headers["content-type"] == JSON and r.json()["kind"] == "Hypervisor"
    r = c.get(f"{HV}/hv0", headers={"Accept": "text/plain, */*;q=0.1"})
    assert r.headers["content-type"] == JSON and r.json()["kind"] == "Hypervisor"


def test_yaml_is_answered_as_yaml(api: Api) -> None:
    c = _fleet(api, "hv0", "hv1")
    r = c.get(f"{HV}/hv0", headers={"Accept": "application/yaml"})
    assert r.status_code == 200 and r.headers["content-type"] == YAML
    assert yaml.safe_load(r.text) == c.get(f"{HV}/hv0").json()
    listed = yaml.safe_load(c.get(HV, headers={"Accept": "application/yaml"}).text)
    assert listed["kind"] == "HypervisorList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["hv0", "hv1"]
    table = yaml.safe_load(c.get(HV, headers={
        "Accept": "application/yaml;as=Table;g=meta.k8s.io;v=v1"}).text)
    assert table["kind"] == "Table" and [row["cells"][0] for row in table["rows"]] == ["hv0", "hv1"]


def test_a_tables_include_object_is_checked_and_its_version_is_the_one_asked(api: Api) -> None:
    c = _fleet(api, "hv0")
    table = "application/json;as=Table;g=meta.k8s.io;v=v1"
    for value, want in (("", "PartialObjectMetadata"), ("Metadata", "PartialObjectMetadata"),
                        ("Object", "Hypervisor"), ("None", None)):
        params = {"includeObject": value} if value else {}
        row = c.get(HV, params=params, headers={"Accept": table}).json()["rows"][0]
        assert (row.get("object") or {}).get("kind") == want, (value, row)
    for bad in ("PartialObjectMetadata", "object", "Bogus"):
        r = c.get(HV, params={"includeObject": bad}, headers={"Accept": table})
        assert r.status_code == 400, r.text
        assert "includeObject" in r.json()["message"] and bad in r.json()["message"]
    # Not a Table: includeObject means nothing and is not read (kube's TableOptions).
    assert c.get(HV, params={"includeObject": "Bogus"}).status_code == 200
    beta = c.get(HV, headers={"Accept": "application/json;as=Table;v=v1beta1;g=meta.k8s.io"}).json()
    assert beta["apiVersion"] == "meta.k8s.io/v1beta1"
    assert beta["rows"][0]["object"]["apiVersion"] == "meta.k8s.io/v1beta1"


def test_a_watch_as_partial_object_metadata_and_a_watch_in_yaml(api: Api) -> None:
    c = _fleet(api)
    w = Watcher(api, {"resourceVersion": "0"}, headers={"Accept": PARTIAL})
    c.post(HV, json=_labelled("hv1", zone="b"))
    w.wait_for(lambda ev: len(ev) >= 1)
    event = w.kinds()[0]
    assert event["type"] == "ADDED"
    assert set(event["object"]) == {"kind", "apiVersion", "metadata"}
    assert event["object"]["kind"] == "PartialObjectMetadata"
    assert event["object"]["metadata"]["labels"] == {"zone": "b"}
    w.close()
    # A watch streams JSON only: YAML alone is 406, as kube's stream negotiation.
    y = Watcher(api, {"resourceVersion": "0"}, headers={"Accept": "application/yaml"})
    assert y.status == 406
    y.close()


CLAUSE = st.one_of(
    st.sampled_from(["application/json", "application/yaml", "*/*", "application/*", "text/plain",
                     "application/vnd.kubernetes.protobuf", "", ";", "a/b;c",
                     "application/json;stream=watch"]),
    st.builds(lambda m, a, g, v, q: f"{m};as={a};g={g};v={v}" + (f";q={q}" if q is not None else ""),
              st.sampled_from(["application/json", "application/yaml", "*/*"]),
              st.sampled_from(["Table", "PartialObjectMetadata", "PartialObjectMetadataList", "Foo", ""]),
              st.sampled_from(["meta.k8s.io", "x", ""]), st.sampled_from(["v1", "v1beta1", "v2"]),
              st.one_of(st.none(), st.sampled_from(["0", "0.5", "1", "x"]))),
    st.text(max_size=30),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(CLAUSE, max_size=5), st.booleans())
def test_negotiate_answers_a_form_or_406_and_nothing_else(clauses: list[str], stream: bool) -> None:
    accept = ",".join(clauses)
    try:
        form = negotiate(accept, stream=stream)
    except ApiError as exc:
        assert exc.code == 406
        return
    assert form.media in SERVED and (not stream or form.media == JSON)
    assert form.kind in ("", "Table", "PartialObjectMetadata", "PartialObjectMetadataList")
    assert form.version in ("v1", "v1beta1")


def test_an_object_may_be_sent_as_yaml_with_the_safe_reader(api: Api) -> None:
    """kube-apiserver takes a custom resource's create or replacement as YAML
    (Content-Type application/yaml); hvfleet answered 415. The same safe reader
    as an apply: no aliases (a YAML bomb is 400), nulls are absent fields."""
    c = api.client()
    doc = yaml.safe_dump(_labelled("hv-y", zone="a"))
    r = c.call("POST", HV, data=doc, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201 and r.json()["metadata"]["labels"] == {"zone": "a"}, r.text
    current = r.json()
    current["spec"]["maintenance"] = "drain"
    current["spec"]["maintenanceReason"] = None
    r = c.call("PUT", f"{HV}/hv-y", data=yaml.safe_dump(current),
               headers={"Content-Type": "application/yaml"})
    assert r.status_code == 200 and r.json()["spec"]["maintenance"] == "drain", r.text
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
    r = c.call("POST", HV, data=bomb, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 400 and "alias" in r.json()["message"], r.text
    r = c.call("POST", HV, data="a: [", headers={"Content-Type": "application/yaml"})
    assert r.status_code == 400 and "YAML" in r.json()["message"], r.text
    r = c.call("POST", HV, data=doc, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415, r.text


@pytest.mark.parametrize(("media", "body"), [
    ("application/json", '{"apiVersion":"hvfleet.io/v1","kind":"Hypervisor",'
                         '"metadata":{"name":"hv-d","labels":{"a":"1","a":"2"}},"spec":{}}'),
    ("application/yaml", "apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata:\n  name: hv-d\n"
                         "  labels:\n    a: '1'\n    a: '2'\nspec: {}\n"),
])
def test_a_key_given_twice_is_judged_by_field_validation(api: Api, media: str, body: str) -> None:
    """kube-apiserver refuses a duplicate field under fieldValidation=Strict and
    warns of it under Warn (the default); hvfleet took the last one silently,
    even under Strict."""
    c = api.client()
    r = c.call("POST", f"{HV}?fieldValidation=Strict", data=body, headers={"Content-Type": media})
    assert r.status_code == 400 and 'duplicate field "a"' in r.json()["message"], r.text
    assert api.store.revision() == 0 or "hv-d" not in [h.metadata.name for h in api.store.list_hypervisors()]
    r = c.call("POST", HV, data=body, headers={"Content-Type": media})
    assert r.status_code == 201 and 'duplicate field \\"a\\"' in r.headers["Warning"], r.text
    assert r.json()["metadata"]["labels"] == {"a": "2"}  # the last one, as JSON readers take it
    patch = '{"metadata":{"labels":{"b":"1","b":"2"}}}'
    r = c.call("PATCH", f"{HV}/hv-d?fieldValidation=Strict", data=patch,
               headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 400, r.text
    r = c.call("PATCH", f"{HV}/hv-d?fieldValidation=Ignore", data=patch,
               headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200 and "Warning" not in r.headers, r.text


def test_a_yaml_date_is_text_as_kube_reads_it(api: Api) -> None:
    """Probe 14: the safe YAML reader made `when: 2024-01-01` a date, and an
    annotation or label given so was 422; kube-apiserver's reader keeps it text."""
    c = api.client()
    body = ("apiVersion: hvfleet.io/v1\nkind: Hypervisor\nmetadata:\n  name: hv-date\n"
            "  annotations:\n    when: 2024-01-01\n    at: 2024-01-01T10:00:00Z\nspec: {}\n")
    r = c.call("POST", HV, data=body, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    assert r.json()["metadata"]["annotations"] == {"when": "2024-01-01", "at": "2024-01-01T10:00:00Z"}
