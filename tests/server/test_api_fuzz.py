"""Fuzz over the API with hypothesis: documents and patches built from the
published schema's field names with arbitrary JSON values, sent to a running
server. No answer is a 5xx, every error is a Status, and every object the
server accepts validates against the OpenAPI schema it publishes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.conftest import Api
from tests.server.objects import HV, RES

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=12) | st.sampled_from(["1", "0.5", "16Gi", "500m", "-1", "1e3", "", "x"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["cpu", "memory", "VGPU", "bad key", "hugepages-2Mi", "x"]) | st.text(max_size=6),
        inner, max_size=3),
    max_leaves=8,
)
SPEC_KEYS = ["overcommit", "reserved", "extraCapacity", "maintenance", "maintenanceReason", "bogus"]
RES_SPEC_KEYS = ["hypervisor", "resources", "consumer", "expiresAt", "source", "bogus"]
META_KEYS = ["labels", "annotations", "resourceVersion", "uid", "generation", "finalizers"]


def documents(kind: str, spec_keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({
        "apiVersion": st.sampled_from(["hvfleet.io/v1", "hvfleet.io/v1", "v1"]),
        "kind": st.sampled_from([kind, kind, "Other"]),
        "metadata": st.fixed_dictionaries(
            {"name": st.sampled_from(["f1", "f2", "Bad_Name", ""])},
            optional={k: JSON for k in META_KEYS}),
    }, optional={"spec": st.dictionaries(st.sampled_from(spec_keys), JSON, max_size=4),
                 "status": st.dictionaries(st.sampled_from(["capacity", "phase", "conditions"]), JSON,
                                           max_size=2)})


def schemas(api: Api) -> dict[str, dict[str, Any]]:
    c = api.client()
    url = c.get("/openapi/v3").json()["paths"]["apis/hvfleet.io/v1"]["serverRelativeURL"]
    comps = c.get(url).json()["components"]["schemas"]
    # With the components, so metadata's $ref to ObjectMeta resolves (and is checked too).
    return {kind: {**comps[f"io.hvfleet.v1.{kind}"], "components": {"schemas": comps}}
            for kind in ("Hypervisor", "Reservation")}


def check_answer(r: Any, kind: str, published: dict[str, dict[str, Any]]) -> None:
    assert r.status_code < 500, r.text
    body = r.json()
    if r.status_code >= 400:
        assert body["kind"] == "Status" and body["code"] == r.status_code, body
        return
    jsonschema.validate(body, published[kind])
    assert body["apiVersion"] == "hvfleet.io/v1" and body["kind"] == kind


def test_no_5xx_and_nothing_invalid_accepted(make_api: Callable[..., Api]) -> None:
    api = make_api()
    published = schemas(api)
    c = api.client()
    c.post(HV, json={"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor", "metadata": {"name": "f1"}})

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(doc=documents("Hypervisor", SPEC_KEYS), how=st.sampled_from(["post", "put", "merge", "apply"]),
           patch=st.dictionaries(st.sampled_from(["spec", "metadata", "status", "kind"]), JSON, max_size=2))
    def hypervisors(doc: dict[str, Any], how: str, patch: dict[str, Any]) -> None:
        name = doc["metadata"]["name"] or "f1"
        if how == "post":
            r = c.post(HV, data=json.dumps(doc), headers={"Content-Type": "application/json"})
        elif how == "put":
            r = c.put(f"{HV}/{name}", data=json.dumps(doc), headers={"Content-Type": "application/json"})
        elif how == "merge":
            r = c.patch(f"{HV}/{name}", patch)
        else:
            r = c.patch(f"{HV}/{name}?force=true", json.dumps(doc), "application/apply-patch+yaml")
        check_answer(r, "Hypervisor", published)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(doc=documents("Reservation", RES_SPEC_KEYS))
    def reservations(doc: dict[str, Any]) -> None:
        r = c.post(RES, data=json.dumps(doc), headers={"Content-Type": "application/json"})
        check_answer(r, "Reservation", published)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(params=st.dictionaries(
        st.sampled_from(["labelSelector", "fieldSelector", "limit", "continue", "resourceVersion",
                         "timeoutSeconds", "watch", "fieldValidation", "includeObject"]),
        st.text(max_size=10) | st.sampled_from(["1", "true", "metadata.name=f1", "a in (b)", "0"]),
        max_size=4))
    def queries(params: dict[str, str]) -> None:
        if params.get("watch"):
            params["timeoutSeconds"] = "1"
        r = c.get(HV, params=params, timeout=10)
        # 504 Timeout is kube's "Too large resource version" (a version not reached yet).
        assert r.status_code < 500 or (r.status_code, r.json()["reason"]) == (504, "Timeout"), r.text

    hypervisors()
    reservations()
    queries()
    for obj in c.get(HV).json()["items"]:
        jsonschema.validate(obj, published["Hypervisor"])
