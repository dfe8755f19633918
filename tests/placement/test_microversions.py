"""Every microversion 1.0-1.39, hvfleet against real Placement 16.0 (in
process): one life of a provider and a consumer (create, inventories, reads,
an allocation in the body form of that version, usages, candidates, deletes)
asked at each version of both. Per request, the status, whether
`last-modified` and `cache-control` are sent, the `openstack-api-version`
answered, and the shape of the body (its keys, and the keys of what they
hold, values aside) must be the same. Then the negotiation's edges: no
header, `latest`, a version past the last or before the first, one that
does not parse, another service's header."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.placement.inprocess_placement import app
from tests.placement.support import Placement, _served_sqlite

Answer = tuple[int, bool, bool, str | None, Any]


@pytest.fixture(scope="module")
def api() -> Iterator[Placement]:
    yield from _served_sqlite(seeded=False)


def _shape(doc: Any, depth: int = 0) -> Any:
    """Keys and the keys of what they hold, three levels down; uuids as keys
    become one placeholder; values become their type."""
    if depth > 3:
        return type(doc).__name__
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            key = "<uuid>" if _is_uuid(k) else k
            out[key] = _shape(v, depth + 1)
        return out
    if isinstance(doc, list):
        return [_shape(doc[0], depth + 1)] if doc else []
    return "number" if isinstance(doc, (int, float)) and not isinstance(doc, bool) else type(doc).__name__


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _headers(version: str | None) -> dict[str, str]:
    out = {"Accept": "application/json"}
    if version is not None:
        out["OpenStack-API-Version"] = f"placement {version}"
    return out


def _answer(status: int, headers: Any, body: bytes) -> Answer:
    doc = json.loads(body) if body and status != 204 else None
    if isinstance(doc, dict) and "errors" in doc:  # the code, not the wording (checked by gabbi)
        doc = {"errors": [{"status": e["status"], "code": e.get("code")} for e in doc["errors"]]}
    else:
        doc = _shape(doc)
    return (status, "last-modified" in headers, "cache-control" in headers,
            headers.get("openstack-api-version"), doc)


def _hvfleet(api: Placement, method: str, path: str, body: Any, headers: dict[str, str]) -> Answer:
    headers = {**headers, "X-Auth-Token": api.tokens["admin"]}
    if body is not None:
        headers["Content-Type"] = "application/json"
    r = requests.request(method, f"{api.url}/placement{path}", headers=headers, verify=str(api.ca),
                         data=None if body is None else json.dumps(body), timeout=30)
    return _answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)


def _placement(method: str, path: str, body: Any, headers: dict[str, str]) -> Answer:
    import webob

    req = webob.Request.blank(path, method=method, headers={**headers, "x-auth-token": "admin"})
    if body is not None:
        req.body = json.dumps(body).encode()
        req.content_type = "application/json"
    resp = req.get_response(app())
    return _answer(resp.status_int, {k.lower(): v for k, v in resp.headers.items()}, resp.body)


def _allocation(minor: int, rp: str, project: str, user: str) -> Any:
    if minor < 12:
        return {"allocations": [{"resource_provider": {"uuid": rp}, "resources": {"VCPU": 1}}],
                "project_id": project, "user_id": user} if minor >= 8 else {
                "allocations": [{"resource_provider": {"uuid": rp}, "resources": {"VCPU": 1}}]}
    body: dict[str, Any] = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": project,
                            "user_id": user}
    if minor >= 28:
        body["consumer_generation"] = None
    if minor >= 38:
        body["consumer_type"] = "INSTANCE"
    return body


def _steps(minor: int) -> Iterator[tuple[str, str, Any]]:
    """The requests of one version, in order (each version its own provider
    and consumer, the same uuids on both sides)."""
    rp, consumer = str(uuid.uuid4()), str(uuid.uuid4())
    project, user = str(uuid.uuid4()), str(uuid.uuid4())
    yield "POST", "/resource_providers", {"name": f"mv-{rp}", "uuid": rp}
    yield "GET", f"/resource_providers/{rp}", None
    yield "GET", f"/resource_providers?name=mv-{rp}", None
    yield "PUT", f"/resource_providers/{rp}/inventories", {
        "resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8}, "DISK_GB": {"total": 10}}}
    yield "GET", f"/resource_providers/{rp}/inventories", None
    yield "GET", f"/resource_providers/{rp}/inventories/VCPU", None
    yield "GET", f"/resource_providers/{rp}/aggregates", None
    yield "GET", f"/resource_providers/{rp}/traits", None
    yield "GET", "/resource_classes/VCPU", None
    yield "GET", "/traits?name=startswith:HW_CPU_X86_AVX512", None
    yield "PUT", f"/allocations/{consumer}", _allocation(minor, rp, project, user)
    yield "GET", f"/allocations/{consumer}", None
    yield "GET", f"/resource_providers/{rp}/allocations", None
    yield "GET", f"/resource_providers/{rp}/usages", None
    yield "GET", f"/usages?project_id={project}", None
    yield "GET", f"/allocation_candidates?resources=VCPU:1&member_of=in:{rp}", None
    yield "GET", f"/resource_providers?resources=VCPU:1&name=mv-{rp}", None
    yield "DELETE", f"/allocations/{consumer}", None
    yield "DELETE", f"/resource_providers/{rp}", None


@pytest.mark.parametrize("minor", range(40), ids=lambda m: f"1.{m}")
def test_each_microversion_answers_as_real_placement(api: Placement, minor: int) -> None:
    headers = _headers(f"1.{minor}")
    wrong = []
    for method, path, body in _steps(minor):
        ours, theirs = _hvfleet(api, method, path, body, headers), _placement(method, path, body, headers)
        if ours != theirs:
            wrong.append(f"{method} {path.split('?')[0]}: hvfleet {ours}\n    placement {theirs}")
    assert not wrong, "\n".join(wrong)


@pytest.fixture(scope="module")
def one_provider(api: Placement) -> str:
    """A provider of the same uuid on both sides: the list below is of it
    alone (the in-process Placement holds other modules' providers)."""
    rp, headers = str(uuid.uuid4()), _headers("1.20")
    body = {"name": f"edge-{rp}", "uuid": rp}
    assert _hvfleet(api, "POST", "/resource_providers", body, headers)[0] == 200
    assert _placement("POST", "/resource_providers", body, headers)[0] == 200
    return f"/resource_providers?uuid={rp}"


@pytest.mark.parametrize("version", [None, "latest", "1.40", "2.0", "0.9", "1.x", "1.05", " 1.39 "])
@pytest.mark.parametrize("path", ["/", "list"])
def test_negotiation_edges_answer_as_real_placement(api: Placement, one_provider: str, version: str | None,
                                                     path: str) -> None:
    headers, path = _headers(version), one_provider if path == "list" else path
    assert _hvfleet(api, "GET", path, None, headers) == _placement("GET", path, None, headers)


def test_another_services_version_header_is_ignored_as_placement_does(
        api: Placement, one_provider: str) -> None:
    headers = {"Accept": "application/json", "OpenStack-API-Version": "compute 2.1"}
    assert _hvfleet(api, "GET", one_provider, None, headers) == _placement("GET", one_provider, None, headers)
