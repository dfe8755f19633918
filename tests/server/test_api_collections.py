"""Lists (selectors, pages, resourceVersion), Table output, discovery and
OpenAPI, and Reservation creation as a claim."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from hvfleet import views
from hvfleet.model.crd import crds
from tests.server.conftest import Api
from tests.server.objects import HV, RES, TABLE, hypervisor, ready_host, reservation, status_of


def fleet(api: Api, n: int = 5) -> None:
    c = api.client()
    for i in range(n):
        doc = hypervisor(f"hv{i}")
        doc["metadata"]["labels"] = {"rack": "a" if i % 2 == 0 else "b"}
        assert c.post(HV, json=doc).status_code == 201


def test_list_with_label_and_field_selectors(api: Api) -> None:
    fleet(api)
    c = api.client()
    body = c.get(HV, params={"labelSelector": "rack=a"}).json()
    assert body["kind"] == "HypervisorList" and body["apiVersion"] == "hvfleet.io/v1"
    assert [o["metadata"]["name"] for o in body["items"]] == ["hv0", "hv2", "hv4"]
    assert int(body["metadata"]["resourceVersion"]) == api.store.revision()
    body = c.get(HV, params={"fieldSelector": "metadata.name=hv3"}).json()
    assert [o["metadata"]["name"] for o in body["items"]] == ["hv3"]
    body = c.get(HV, params={"fieldSelector": "metadata.name!=hv3", "labelSelector": "rack in (b)"}).json()
    assert [o["metadata"]["name"] for o in body["items"]] == ["hv1"]
    status_of(400, "BadRequest", c.get(HV, params={"fieldSelector": "spec.maintenance=drain"}).json())
    status_of(400, "BadRequest", c.get(HV, params={"labelSelector": "a in"}).json())  # as kube


def test_every_field_selector_term_holds_in_a_list_and_a_deletecollection(api: Api) -> None:
    """Terms are ANDed, as kube-apiserver reads them: two `!=` terms keep both
    names out of a list and out of a deletecollection (which deleted the
    first one before), two different `=` names match nothing, and the
    namespace of these cluster-scoped objects is ""."""
    fleet(api)
    c = api.client()

    def names(params: dict[str, str]) -> list[str]:
        r = c.get(HV, params=params)
        assert r.status_code == 200, r.text
        return [o["metadata"]["name"] for o in r.json()["items"]]

    assert names({"fieldSelector": "metadata.name!=hv0,metadata.name!=hv1"}) == ["hv2", "hv3", "hv4"]
    assert names({"fieldSelector": "metadata.name=hv0,metadata.name=hv1"}) == []
    assert names({"fieldSelector": "metadata.name=hv0,metadata.name==hv0,"}) == ["hv0"]
    assert names({"fieldSelector": "metadata.namespace=,metadata.name!=hv0"}) == ["hv1", "hv2", "hv3", "hv4"]
    assert names({"fieldSelector": "metadata.namespace=default"}) == []
    for bad in ("metadata.name", "metadata.name=a=b", "metadata.name=a\\x", "spec.maintenance=drain"):
        status_of(400, "BadRequest", c.get(HV, params={"fieldSelector": bad}).json())
    gone = c.delete(HV, params={"labelSelector": "rack=a",
                                "fieldSelector": "metadata.name!=hv0,metadata.name!=hv2"})
    assert gone.status_code == 200, gone.text
    assert [o["metadata"]["name"] for o in gone.json()["items"]] == ["hv4"]
    assert names({}) == ["hv0", "hv1", "hv2", "hv3"]


def test_list_pages_with_limit_and_continue(api: Api) -> None:
    fleet(api, 7)
    c = api.client()
    names: list[str] = []
    params: dict[str, Any] = {"limit": 3}
    pages = 0
    while True:
        body = c.get(HV, params=params).json()
        pages += 1
        names += [o["metadata"]["name"] for o in body["items"]]
        token = body["metadata"].get("continue")
        if not token:
            break
        assert body["metadata"]["remainingItemCount"] == 7 - len(names)
        params = {"limit": 3, "continue": token}
    assert names == [f"hv{i}" for i in range(7)] and pages == 3
    status_of(400, "BadRequest", c.get(HV, params={"continue": "garbage!"}).json())

    # The pages of one list come from one read: an object created between two
    # pages is not in them, and every page carries the first page's version.
    first = c.get(HV, params={"limit": 3}).json()
    c.post(HV, json=hypervisor("hv35"))
    rest = c.get(HV, params={"limit": 10, "continue": first["metadata"]["continue"]}).json()
    assert [o["metadata"]["name"] for o in rest["items"]] == [f"hv{i}" for i in range(3, 7)]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert "hv35" in [o["metadata"]["name"] for o in c.get(HV).json()["items"]]


def _forged(token: str, **fields: Any) -> str:
    """A continue token with some of its fields changed by hand."""
    data = json.loads(base64.urlsafe_b64decode(token))
    return base64.urlsafe_b64encode(json.dumps({**data, **fields}).encode()).decode()


def test_a_continue_token_naming_a_version_not_reached_is_400_for_any_caller(api: Api) -> None:
    """A token edited to name a revision past the store's is an invalid token
    (400, as kube's "continue key is not valid"), never a 500."""
    fleet(api, 3)
    for who in ("ops-token", "viewer-token"):
        c = api.client(who)
        token = c.get(HV, params={"limit": 1}).json()["metadata"]["continue"]
        for rv in (api.store.revision() + 1000, 99999999):
            r = c.get(HV, params={"limit": 2, "continue": _forged(token, rv=rv, snapshot="")})
            status_of(400, "BadRequest", r.json())
            assert "continue" in r.json()["message"]


def test_a_continue_token_with_anything_after_it_is_not_the_token(api: Api) -> None:
    """Probe 14: text after a token's padding was dropped by a lenient base64
    decode, and the page answered as for the token; kube's strict decode refuses it."""
    fleet(api, 3)
    c = api.client()
    token = c.get(HV, params={"limit": 1}).json()["metadata"]["continue"]
    assert c.get(HV, params={"limit": 1, "continue": token}).status_code == 200
    for spoiled in (token + "x", token + "=", token[:-1] + "!", token + "&x"):
        r = c.get(HV, params={"limit": 1, "continue": spoiled})
        status_of(400, "BadRequest", r.json())


def test_a_continue_token_with_a_resource_version_is_400_as_kube_answers_it(api: Api) -> None:
    fleet(api, 3)
    c = api.client()
    first = c.get(HV, params={"limit": 1}).json()
    token, rv = first["metadata"]["continue"], first["metadata"]["resourceVersion"]
    r = c.get(HV, params={"limit": 1, "continue": token, "resourceVersion": rv})
    status_of(400, "BadRequest", r.json())
    assert "specifying resource version is not allowed when using continue" in r.json()["message"]
    # "0" is read as no version (kube: treated as the continue token alone).
    r = c.get(HV, params={"limit": 1, "continue": token, "resourceVersion": "0"})
    assert r.status_code == 200, r.text
    assert [o["metadata"]["name"] for o in r.json()["items"]] == ["hv1"]


def test_a_limited_list_at_a_version_without_a_match_is_read_exactly_there(api: Api) -> None:
    """kube's legacy rule: resourceVersion=R (not 0) with a limit and no
    resourceVersionMatch is Exact; without a limit it is NotOlderThan."""
    fleet(api, 4)
    c = api.client()
    then = c.get(HV).json()
    rv = then["metadata"]["resourceVersion"]
    c.patch(f"{HV}/hv0", {"metadata": {"labels": {"rack": "c"}}})
    c.delete(f"{HV}/hv1")
    c.post(HV, json=hypervisor("hv11"))
    first = c.get(HV, params={"resourceVersion": rv, "limit": 2}).json()
    assert first["metadata"]["resourceVersion"] == rv
    assert first["items"] == then["items"][:2]
    rest = c.get(HV, params={"limit": 2, "continue": first["metadata"]["continue"]}).json()
    assert rest["items"] == then["items"][2:]
    now = c.get(HV, params={"resourceVersion": rv}).json()
    assert [o["metadata"]["name"] for o in now["items"]] == ["hv0", "hv11", "hv2", "hv3"]
    assert now["metadata"]["resourceVersion"] == str(api.store.revision())


def test_remaining_item_count_is_left_out_of_a_selected_list(api: Api) -> None:
    """As kube's ListMeta: the count is only known for a list without selectors."""
    fleet(api, 5)
    c = api.client()
    whole = c.get(HV, params={"limit": 1}).json()["metadata"]
    assert whole["remainingItemCount"] == 4 and whole["continue"]
    for params in ({"labelSelector": "rack=a"}, {"fieldSelector": "metadata.name!=hv0"},
                   {"labelSelector": "rack=a", "fieldSelector": "metadata.name!=hv0"}):
        meta = c.get(HV, params={"limit": 1, **params}).json()["metadata"]
        assert meta["continue"] and "remainingItemCount" not in meta, params


def test_table_has_the_columns_of_hvfleet_get(api: Api) -> None:
    c = api.client()
    made = c.post(HV, json=hypervisor("hv1", overcommit={"cpu": 2})).json()
    status = {"capacity": {"cpu": "16", "memory": "64Gi"}, "allocation": {"cpu": "3", "memory": "8Gi"},
              "effectiveCapacity": {"cpu": "32", "memory": "64Gi"},
              "conditions": [{"type": "Ready", "status": "True"}],
              "lastHeartbeatTime": datetime.now(UTC).isoformat()}
    r = api.client("agent-hv1-token").put(f"{HV}/hv1/status", json={**made, "status": status})
    assert r.status_code == 200, r.text
    body = c.get(HV, headers={"Accept": TABLE}).json()
    assert body["kind"] == "Table" and body["apiVersion"] == "meta.k8s.io/v1"
    cols = [col["name"] for col in body["columnDefinitions"]]
    # The columns of `hvfleet get -o wide`; the wide ones only with kubectl -o wide.
    assert cols == [c.name for c in views.hypervisor_columns(wide=True)]
    assert cols[:4] == ["NAME", "READY", "CPU", "MEMORY"] and "AGE" in cols
    narrow = {c.name for c in views.hypervisor_columns(wide=False)}
    assert [col["priority"] for col in body["columnDefinitions"]] == [0 if c in narrow else 1 for c in cols]
    (row,) = body["rows"]
    cells = dict(zip(cols, row["cells"], strict=True))
    assert (cells["NAME"], cells["READY"], cells["CPU"], cells["MEMORY"], cells["INSTANCES"]) == (
        "hv1", "Ready", "3/32", "8Gi/64Gi", "0")
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == "hv1"
    one = c.get(f"{HV}/hv1", headers={"Accept": TABLE}).json()
    assert one["kind"] == "Table" and one["rows"][0]["cells"][0] == "hv1"


def test_discovery_documents(api: Api) -> None:
    c = api.client()
    assert c.get("/api").json() == {"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []}
    groups = c.get("/apis").json()
    assert groups["kind"] == "APIGroupList"
    assert groups["groups"][0]["name"] == "hvfleet.io"
    assert groups["groups"][0]["preferredVersion"]["groupVersion"] == "hvfleet.io/v1"
    assert c.get("/apis/hvfleet.io").json()["kind"] == "APIGroup"
    resources = {r["name"]: r for r in c.get("/apis/hvfleet.io/v1").json()["resources"]}
    # Every kind `hvfleet crd` exports, with /status where its CRD has that subresource.
    expected = set()
    for crd in crds():
        plural = crd["spec"]["names"]["plural"]
        expected.add(plural)
        if "status" in crd["spec"]["versions"][0].get("subresources", {}):
            expected.add(f"{plural}/status")
    assert set(resources) == expected
    assert {"hypervisors", "hypervisors/status", "reservations", "reservations/status",
            "leases"} <= expected
    hv = resources["hypervisors"]
    assert (hv["singularName"], hv["kind"], hv["namespaced"]) == ("hypervisor", "Hypervisor", False)
    assert "hv" in hv["shortNames"] and "res" in resources["reservations"]["shortNames"]
    assert set(hv["verbs"]) == {"get", "list", "watch", "create", "update", "patch", "delete",
                               "deletecollection"}
    assert set(resources["hypervisors/status"]["verbs"]) == {"get", "update", "patch"}
    # /version needs no token; the rest does.
    assert api.client(None).get("/version").json()["major"] == "1"
    status_of(401, "Unauthorized", api.client(None).get("/apis").json())


def test_openapi_carries_the_crd_schema_and_field_validation(api: Api) -> None:
    c = api.client()
    schemas = {crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
               for crd in crds()}
    root = c.get("/openapi/v3").json()
    url = root["paths"]["apis/hvfleet.io/v1"]["serverRelativeURL"]
    doc = c.get(url).json()
    hv = doc["components"]["schemas"]["io.hvfleet.v1.Hypervisor"]
    # The CRD's schema, with metadata the server's own ObjectMeta (the CRD leaves it open).
    published = {k: v for k, v in hv.items() if k != "x-kubernetes-group-version-kind"}
    assert published["properties"].pop("metadata")["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]
    crd_schema = json.loads(json.dumps(schemas["Hypervisor"]))
    assert crd_schema["properties"].pop("metadata")["type"] == "object"
    assert published == crd_schema
    assert hv["x-kubernetes-group-version-kind"] == [{"group": "hvfleet.io", "version": "v1",
                                                      "kind": "Hypervisor"}]
    patch = doc["paths"]["/apis/hvfleet.io/v1/hypervisors/{name}"]["patch"]
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "Hypervisor"
    v2 = c.get("/openapi/v2", headers={"Accept": "application/json"}).json()
    assert v2["swagger"] == "2.0"
    hv2 = v2["definitions"]["io.hvfleet.v1.Hypervisor"]
    assert "anyOf" not in str(hv2) and hv2["properties"]["spec"]["type"] == "object"
    assert c.get("/openapi/v2", headers={"Accept": "text/html"}).status_code == 406
    r = c.get("/openapi/v2", headers={"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"})
    assert r.status_code == 200 and r.headers["content-type"].endswith("+protobuf")
    assert b"io.hvfleet.v1.Hypervisor" in r.content


def test_creating_a_reservation_is_a_claim(api: Api) -> None:
    ready_host(api, cpu="8")
    c = api.client("sched-token")
    r = c.post(RES, json=reservation("r1", "6"))
    assert r.status_code == 201, r.text
    assert r.json()["status"]["phase"] == "Active"
    assert r.json()["metadata"]["labels"]["hvfleet.io/hypervisor"] == "hv1"
    # 6 of 8 CPUs are held: 4 more do not fit, and the answer says why.
    r = c.post(RES, json=reservation("r2", "4", consumer="vm-2"))
    status_of(409, "Conflict", r.json())
    assert "cpu" in r.json()["message"]
    causes = r.json()["details"]["causes"]
    assert causes and causes[0]["reason"] == "insufficient"
    assert causes[0]["field"] == "spec.resources.cpu"
    # The same consumer twice on one host is refused by the same check as `hvfleet reserve`.
    status_of(409, "Conflict", c.post(RES, json=reservation("r3", "1")).json())
    assert [r.name for r in api.store.list_reservations()] == ["r1"]
    # Server-side apply of a new reservation claims too.
    r = c.patch(f"{RES}/r4", __import__("yaml").safe_dump(reservation("r4", "3", consumer="vm-4")),
                "application/apply-patch+yaml")
    status_of(409, "Conflict", r.json())
    r = c.post(RES, json=reservation("r5", "1", host="nowhere"))
    status_of(422, "Invalid", r.json())
    assert r.json()["details"]["causes"][0]["field"] == "spec.hypervisor"
    # Applying an existing reservation (YAML, an unquoted timestamp) keeps its phase.
    text = ("apiVersion: hvfleet.io/v1\nkind: Reservation\nmetadata: {name: r1}\n"
            "spec: {hypervisor: hv1, consumer: vm-1, resources: {cpu: '6'},\n"
            "       expiresAt: 2030-01-01T00:00:00Z}\n")
    r = c.patch(f"{RES}/r1", text, "application/apply-patch+yaml")
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["expiresAt"].startswith("2030-01-01T00:00:00")
    assert r.json()["status"]["phase"] == "Active"


def test_agent_leases(api: Api) -> None:
    lease = {"apiVersion": "hvfleet.io/v1", "kind": "Lease", "metadata": {"name": "hv1"},
             "spec": {"holderIdentity": "agent/hv1", "leaseDurationSeconds": 30,
                      "renewTime": datetime.now(UTC).isoformat()}}
    agent = api.client("agent-hv1-token")
    r = agent.post("/apis/hvfleet.io/v1/leases", json=lease)
    assert r.status_code == 201, r.text
    # Only agent/hv1 writes hv1's Lease, whatever the authorizer allowed.
    r = api.client().patch("/apis/hvfleet.io/v1/leases/hv1", {"spec": {"leaseDurationSeconds": 99}})
    status_of(403, "Forbidden", r.json())
    body = api.client("viewer-token").get("/apis/hvfleet.io/v1/leases", headers={"Accept": TABLE}).json()
    assert [c["name"] for c in body["columnDefinitions"]] == [c.name for c in views.lease_columns(wide=True)]
    assert body["rows"][0]["cells"][:3] == ["hv1", "agent/hv1", "True"]
    status_of(404, "NotFound", agent.get("/apis/hvfleet.io/v1/leases/hv1/status").json())


def test_overcommit_policies_are_served_with_their_columns(api: Api) -> None:
    c = api.client()
    policy = {"apiVersion": "hvfleet.io/v1", "kind": "OvercommitPolicy", "metadata": {"name": "p1"},
              "spec": {"overcommit": {"cpu": 4}}}
    assert c.post("/apis/hvfleet.io/v1/overcommitpolicies", json=policy).status_code == 201
    c.post(HV, json=hypervisor("hv1"))
    body = c.get("/apis/hvfleet.io/v1/overcommitpolicies", headers={"Accept": TABLE}).json()
    cols = [col["name"] for col in body["columnDefinitions"]]
    assert cols == [col.name for col in views.policy_columns(wide=True)]
    cells = dict(zip(cols, body["rows"][0]["cells"], strict=True))
    assert cells["NAME"] == "p1"
    # The hypervisor table shows the ratio the policy gives (the wide column).
    body = c.get(HV, headers={"Accept": TABLE}).json()
    cols = [col["name"] for col in body["columnDefinitions"]]
    assert "cpu=4" in dict(zip(cols, body["rows"][0]["cells"], strict=True))["OVERCOMMIT"]
